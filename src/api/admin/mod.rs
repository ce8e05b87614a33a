//! The admin routes (`/v1/admin/*`): operator actions on a running service. Every handler
//! takes an [`crate::auth::AdminCaller`], so only an admin key (or, without keys, a caller
//! on loopback) reaches it.
//!
//! - `reload`: `POST /v1/admin/reload`, the configuration re-read and rolled over to.
//! - `packages`: `GET/POST/DELETE /v1/admin/packages`, `POST /v1/admin/packages/sync`.

mod packages;
pub(crate) mod reload;

use axum::Router;
use axum::routing::{get, post};

use super::SharedState;
use crate::error::ApiError;

/// Runs an operator action on a task of its own and waits for it: a client that leaves
/// (a closed connection, a proxy's or `curl -m`'s timeout) drops this wait, never the
/// action. Dropped midway, a rollover left its new generation's zygotes running, neither
/// serving nor stopped, until the service stopped.
async fn to_completion<T: Send + 'static>(
    action: impl Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::spawn(action).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(ApiError::Unavailable(
            "the service is shutting down; the action was stopped".into(),
        )),
    }
}

/// The admin routes, nested under `/v1/admin`.
pub fn routes() -> Router<SharedState> {
    Router::new()
        .route("/reload", post(reload::reload))
        .route(
            "/packages",
            get(packages::list)
                .post(packages::add)
                .delete(packages::remove),
        )
        .route("/packages/sync", post(packages::sync))
}
