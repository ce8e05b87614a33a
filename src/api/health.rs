//! `GET /health`: Onyx's `{"status": "ok"}` plus the pool, the interpreter, the zygote
//! generation serving (id, reason, when; sessions per generation), the file store and the
//! state of every sandbox layer; `"degraded"` with the reason (`last_spawn_error`) while
//! a zygote is down or workers cannot be started, (`pool.tiers[].start_error`) while a
//! tier's zygote cannot start or be restarted, and (`file_store.detail`) while the file
//! store cannot serve (with `file_store.last_recovery` once a local store's directory had
//! to be recreated), and (`workspace.nearly_full`) while the workspace file system is at
//! least 90% full ([`crate::pool::bound::NEARLY_FULL_PERCENT`]): staging is about to be
//! refused and runs to fail writing. `workspace` also says whether it is the service's own
//! bounded tmpfs, and why not; `degraded` (`workspace.bound_lost`) once that tmpfs is gone
//! under the running service. A tier whose zygote is still preloading is `starting`: not
//! a fault.
//!
//! `GET /ready` (for load balancers and Kubernetes probes): 200 when every request is
//! served correctly without waiting for a zygote: some tier serves (its zygote is up and
//! has had a worker ready), and a job routed to a tier that does not serve yet (starting,
//! or failed to start, or its zygote died and is being restarted) runs on one that does,
//! only slower (it imports what its tier would have preloaded). 503 while no tier serves
//! (before the first does, or while the only zygotes are down), while workers cannot be
//! started, and once shutdown has begun. The file store is not part of readiness: replicas share it, so its outage would
//! take every replica out of the balancer at once, though runs that need no file can still
//! be served.

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use serde_json::{Value, json};

use super::SharedState;
use crate::error::ApiError;
use crate::files::watch::StoreState;
use crate::pool::TierState;

pub async fn health(State(state): State<SharedState>) -> Json<Value> {
    let pool = state.pool.status();
    let zygote = state.pool.zygote_info();
    let alive = pool.zygote.as_ref().is_some_and(|z| z.alive);
    let store = state.store_watch.state();
    let no_tier_failed = pool.tiers.iter().all(|t| t.state != TierState::Failed);
    let workspace = state.pool.workspace_usage();
    let healthy = alive
        && no_tier_failed
        && pool.last_spawn_error.is_none()
        && !matches!(store, StoreState::Unavailable(_))
        && !workspace
            .as_ref()
            .is_some_and(|ws| ws.nearly_full || ws.bound_lost);
    let cpu_budget = state.pool.session_cpu_budget();
    let mut sandbox: serde_json::Map<String, Value> = zygote
        .sandbox
        .iter()
        .map(|r| {
            let entry = json!({ "state": r.state, "detail": r.detail });
            (r.layer.as_str().to_owned(), entry)
        })
        .collect();
    sandbox.insert("worker_uids".into(), worker_uids(&state));
    Json(json!({
        "status": if healthy { "ok" } else { "degraded" },
        "last_spawn_error": pool.last_spawn_error,
        "version": env!("CARGO_PKG_VERSION"),
        "python_version": zygote.python_version,
        "preloaded": zygote.preloaded,
        "ready": not_ready(&state).is_none(),
        "pool": pool,
        "sessions": {
            "active": state.sessions.count(),
            "max": state.sessions.settings().max_sessions,
            // Sessions per generation (no ids: this route is public).
            "by_generation": state.sessions.by_generation(),
            // What one CPU-time budget of a session's worker covers, `per_run` (or `off`
            // with the rlimits layer), and who enforces it: the kernel, or without
            // CAP_SYS_RESOURCE the service's watchdog (`null` when off).
            "cpu_budget": cpu_budget.scope(),
            "cpu_budget_enforced_by": cpu_budget.enforced_by(),
        },
        "generation": state.generation(),
        "file_store": file_store(&state, store),
        "workspace": workspace,
        // `limits.max_total_memory_mb` as the kernel took it, what all workers use of it
        // now, and how many the kernel killed for it (`null` where nothing bounds it).
        "workers_memory": state.pool.workers_memory(),
        "sandbox": sandbox,
    }))
}

/// The range of worker uids this instance claimed and how many are in use (leased to a
/// worker not yet reaped or whose workspace is not removed yet), or that workers keep the
/// service's uid.
fn worker_uids(state: &SharedState) -> Value {
    match state.pool.uid_status() {
        Some(uids) => json!({
            "per_worker": true,
            "first": uids.first,
            "last": uids.last,
            "count": uids.count,
            "in_use": uids.in_use,
            "withheld": uids.withheld,
            "lock_file": uids.lock_file,
        }),
        None => json!({
            "per_worker": false,
            "detail": format!(
                "workers keep the service's uid {} (it does not run as root, or drop_privileges is switched off)",
                nix::unistd::getuid()
            ),
        }),
    }
}

/// `{"backend", "state", "detail"}`: the state and error as the last background check
/// found them (`/health` and the status page never wait on the store).
pub(super) fn file_store(state: &SharedState, store: StoreState) -> Value {
    let mut entry = serde_json::to_value(store).expect("a store state serialises");
    entry["backend"] = json!(state.config().files.backend);
    // The store's directory had been removed under the service and was recreated: what
    // was lost, for as long as this process runs.
    if let Some(recovery) = state.store.last_recovery() {
        entry["last_recovery"] = json!(recovery);
    }
    entry
}

pub async fn ready(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    match not_ready(&state) {
        Some(why) => Err(ApiError::NotReady(why)),
        None => Ok(Json(json!({ "status": "ready" }))),
    }
}

/// Why the service should not be sent requests now, if it should not.
pub(super) fn not_ready(state: &SharedState) -> Option<String> {
    let pool = state.pool.status();
    let down = (pool.tiers.iter()).find(|t| t.zygote.as_ref().is_some_and(|z| !z.alive));
    if state.stopping.is_cancelled() {
        Some("the service is shutting down".into())
    } else if let Some(error) = pool.last_spawn_error {
        Some(format!("workers cannot be started: {error}"))
    } else if pool.tiers.iter().all(|t| t.state != TierState::Serving) {
        // Once a tier serves, a job routed to a tier that does not serve (starting, or its
        // zygote restarting) runs on it, correct and only slower, and a tier drained by
        // traffic later is busy, not unready.
        Some(match down {
            Some(tier) => format!(
                "the zygote of tier {:?} is not running; it is being restarted",
                tier.name
            ),
            None => "no tier has a worker ready yet".into(),
        })
    } else {
        None
    }
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}
