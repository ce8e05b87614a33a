//! `GET /health`: Onyx's `{"status": "ok"}` plus the pool, the interpreter and the state
//! of every sandbox layer; `"degraded"` with the reason (`last_spawn_error`) while the
//! zygote is down or workers cannot be started. `GET /ready`: 200 once the pool has
//! workers, 503 before that, while the zygote is down or workers cannot be started, and
//! once shutdown has begun (for load balancers and Kubernetes probes).

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
        },
        "sandbox": sandbox,
    }))
}

pub async fn ready(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    match not_ready(&state) {
        None => Ok(Json(json!({ "status": "ready" }))),
        Some(why) => Err(ApiError::NotReady(why)),
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
    } else if pool.workers_spawned == 0 {
        Some("no worker is ready yet".into())
    } else {
        None
    }
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}
