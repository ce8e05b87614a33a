//! The HTTP surface: the router and one module per group of routes.

mod execute;
mod files;
mod health;
mod json;
mod metrics;
mod status;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::files::SharedStore;
use crate::metrics::{self as service_metrics, Metrics};
use crate::pool::Pool;

/// What every handler can reach.
pub struct AppState {
    pub config: Config,
    pub pool: Pool,
    pub store: SharedStore,
    pub metrics: Arc<Metrics>,
    /// Fires when shutdown begins: from then on `/ready` answers 503.
    pub stopping: CancellationToken,
}

pub type SharedState = Arc<AppState>;

pub fn router(state: SharedState) -> Router {
    let body_limit = state.config.limits.max_request_bytes;
    // Uploads are bounded by the file store, which answers 413 past the maximum file size;
    // the body limit only stops other multipart fields a little after that.
    let upload_limit = usize::try_from(state.config.files.max_file_size_mb << 20)
        .unwrap_or(usize::MAX)
        .saturating_add(1 << 20);
    let metrics = state.metrics.clone();
    Router::new()
        .route("/", get(status::page))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/status", get(status::status))
        .route("/v1/execute", post(execute::execute))
        .route(
            "/v1/files",
            post(files::upload)
                .layer(DefaultBodyLimit::max(upload_limit))
                .get(files::list),
        )
        .route(
            "/v1/files/{file_id}",
            get(files::download).delete(files::delete),
        )
        .fallback(health::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(
            metrics,
            service_metrics::http::count_requests,
        ))
        .with_state(state)
}
