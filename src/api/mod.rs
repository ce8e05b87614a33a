//! The HTTP surface: the router and one module per group of routes.

mod execute;
mod health;
mod json;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::config::Config;
use crate::pool::Pool;

/// What every handler can reach.
pub struct AppState {
    pub config: Config,
    pub pool: Pool,
}

pub type SharedState = Arc<AppState>;

pub fn router(state: SharedState) -> Router {
    let body_limit = state.config.limits.max_request_bytes;
    Router::new()
        .route("/health", get(health::health))
        .route("/v1/execute", post(execute::execute))
        .fallback(health::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}
