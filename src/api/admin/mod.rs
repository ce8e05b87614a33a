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
