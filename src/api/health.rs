//! `GET /health`: Onyx's `{"status": "ok"}` plus the pool, the interpreter, the zygote
//! generation serving (id, reason, when; sessions per generation), the file store and the
//! state of every sandbox layer; `"degraded"` with the reason (`last_spawn_error`) while
//! the zygote is down or workers cannot be started, and (`file_store.detail`) while the
//! file store cannot serve (with `file_store.last_recovery` once a local store's directory
//! had to be recreated). `GET /ready`: 200 once every tier that keeps idle workers has
//! had one ready (no job then waits for a zygote or a spawn), 503 before that, while the
//! zygote is down or workers cannot be started, and once shutdown has begun (for load
//! balancers and Kubernetes probes). The file store is not part of readiness: replicas
//! share it, so its outage would take every replica out of the balancer at once, though
//! runs that need no file can still be served.

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use serde_json::{Value, json};

use super::SharedState;
use crate::error::ApiError;
use crate::files::watch::StoreState;

pub async fn health(State(state): State<SharedState>) -> Json<Value> {
    let pool = state.pool.status();
    let zygote = state.pool.zygote_info();
    let alive = pool.zygote.as_ref().is_some_and(|z| z.alive);
    let store = state.store_watch.state();
    let healthy =
        alive && pool.last_spawn_error.is_none() && !matches!(store, StoreState::Unavailable(_));
    let sandbox: serde_json::Map<String, Value> = zygote
        .sandbox
        .iter()
        .map(|r| {
            let entry = json!({ "state": r.state, "detail": r.detail });
            (r.layer.as_str().to_owned(), entry)
        })
        .collect();
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
        },
        "generation": state.generation(),
        "file_store": file_store(&state, store),
        "sandbox": sandbox,
    }))
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
    if state.stopping.is_cancelled() {
        Some("the service is shutting down".into())
    } else if !pool.zygote.as_ref().is_some_and(|z| z.alive) {
        Some("the zygote is not running; it is being restarted".into())
    } else if let Some(error) = pool.last_spawn_error {
        Some(format!("workers cannot be started: {error}"))
    } else if pool.stocked {
        // Once every tier that wanted idle workers has had one, it never goes back: a tier
        // drained by traffic is busy, and one asked for its first worker by new demand
        // (with `tiers.min_idle = 0`) is a spawn away, not unready.
        None
    } else {
        // Until then, a job routed to a tier without one would wait for its zygote and a
        // spawn.
        let tier = (pool.tiers.iter()).find(|t| t.workers_spawned == 0 && t.target_idle > 0);
        Some(tier.map_or_else(
            || "no worker is ready yet".to_owned(),
            |tier| format!("no worker of tier {:?} is ready yet", tier.name),
        ))
    }
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}
