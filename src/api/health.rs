//! `GET /health`: Onyx's `{"status": "ok"}` plus the pool, the interpreter and the state
//! of every sandbox layer.

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
    let sandbox: serde_json::Map<String, Value> = zygote
        .sandbox
        .iter()
        .map(|r| {
            let entry = json!({ "state": r.state, "detail": r.detail });
            (r.layer.as_str().to_owned(), entry)
        })
        .collect();
    Json(json!({
        "status": if alive { "ok" } else { "degraded" },
        "version": env!("CARGO_PKG_VERSION"),
        "python_version": zygote.python_version,
        "preloaded": zygote.preloaded,
        "pool": pool,
        "sandbox": sandbox,
    }))
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}
