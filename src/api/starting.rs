//! The service before its pool has started: the listener is bound and answers at once,
//! every request with a 503, `Retry-After` and what is happening (the lightest tier's
//! zygote is preloading), instead of leaving clients hanging in the accept queue; `/health`
//! answers 200 `"status": "starting"` (the process is alive: liveness probes must not kill
//! it for preloading) with an empty pool. Once the pool has started (its fuller tiers may
//! still be preloading: they serve once up) the real router is put in place and serves
//! every request that follows.

use std::sync::{Arc, OnceLock};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use tower::ServiceExt;

use crate::error::ApiError;

/// Where the real router goes once the service is ready.
pub type RouterCell = Arc<OnceLock<Router>>;

/// A router answering 503 until `cell` holds the real one, then handing every request to
/// it. `what` says what the service is doing meanwhile; `target_size` is `pool.size`.
pub fn until_ready(cell: RouterCell, what: String, target_size: usize) -> Router {
    Router::new().fallback_service(tower::service_fn(move |request: Request| {
        let cell = cell.clone();
        let what = what.clone();
        async move {
            let response: Response = match cell.get() {
                Some(router) => router.clone().oneshot(request).await.into_response(),
                None if request.uri().path() == "/health" => Json(json!({
                    "status": "starting",
                    "ready": false,
                    "detail": format!("the service is starting: {what}"),
                    "version": env!("CARGO_PKG_VERSION"),
                    "pool": { "idle": 0, "busy": 0, "spawning": 0, "target_size": target_size, "tiers": [] },
                }))
                .into_response(),
                None => ApiError::NotReady(format!(
                    "the service is starting: {what}; retry in a moment"
                ))
                .into_response(),
            };
            Ok::<_, std::convert::Infallible>(response)
        }
    }))
}
