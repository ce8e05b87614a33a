//! `GET /health`: Onyx's `{"status": "ok"}` plus the pool, the interpreter, the zygote
//! generation serving (id, reason, when; sessions per generation) and the state of every
//! sandbox layer; `"degraded"` with the reason (`last_spawn_error`) while the
//! zygote is down or workers cannot be started. `GET /ready`: 200 once the pool has
//! workers, 503 before that, while the zygote is down or workers cannot be started, while
//! the file store cannot be reached, and once shutdown has begun (for load balancers and
//! Kubernetes probes).

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use serde_json::{Value, json};

use super::SharedState;
use crate::error::ApiError;

pub async fn health(State(state): State<SharedState>) -> Json<Value> {
    let pool = state.pool.status();
    let zygote = state.pool.zygote_info();
    let alive = pool.zygote.as_ref().is_some_and(|z| z.alive);
    let healthy = alive && pool.last_spawn_error.is_none();
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
        "sandbox": sandbox,
    }))
}

pub async fn ready(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    if let Some(why) = not_ready(&state) {
        return Err(ApiError::NotReady(why));
    }
    // A shared store that cannot be reached fails every file request: say so here too.
    match tokio::time::timeout(STORE_CHECK_TIMEOUT, state.store.check()).await {
        Ok(Ok(())) => Ok(Json(json!({ "status": "ready" }))),
        Ok(Err(e)) => Err(ApiError::NotReady(e.to_string())),
        Err(_) => Err(ApiError::NotReady(format!(
            "the file store did not answer within {} ms",
            STORE_CHECK_TIMEOUT.as_millis()
        ))),
    }
}

/// How long `/ready` waits for the file store's answer.
const STORE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Why the service should not be sent requests now, if it should not.
pub(super) fn not_ready(state: &SharedState) -> Option<String> {
    let pool = state.pool.status();
    if state.stopping.is_cancelled() {
        Some("the service is shutting down".into())
    } else if !pool.zygote.as_ref().is_some_and(|z| z.alive) {
        Some("the zygote is not running; it is being restarted".into())
    } else if let Some(error) = pool.last_spawn_error {
        Some(format!("workers cannot be started: {error}"))
    } else if pool.workers_spawned == 0 {
        Some("no worker is ready yet".into())
    } else {
        None
    }
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}
