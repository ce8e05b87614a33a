//! How large a request body a group of routes takes. A body whose `Content-Length` says it
//! is larger is refused before a byte of it is read: a client that declares 200 MB and
//! sends slowly hears the 413 at once, instead of after the first `limit` bytes (axum's
//! [`DefaultBodyLimit`] only counts what is read). A body of unknown length (chunked) is
//! read up to the limit and refused as it passes it. Either way the refusal has the
//! group's JSON `detail`; what becomes of the unread rest is `server::unread_body`'s.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tower_http::limit::RequestBodyLimitLayer;

use super::SharedState;
use super::error_bodies::declares_json;
use crate::error::ApiError;

/// The refusal of a body over a group's limit, in the words of that group.
pub type TooLarge = fn(&SharedState) -> ApiError;

/// `routes` with their bodies bounded by `limit` bytes, a body over it refused with
/// `too_large`. Only the routes `routes` has now are bounded (see [`Router::layer`]).
pub fn bounded(
    routes: Router<SharedState>,
    state: &SharedState,
    limit: usize,
    too_large: TooLarge,
) -> Router<SharedState> {
    routes
        // The limit below is the only one: axum's own (2 MB unless told) would be a second.
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(axum::middleware::map_response_with_state(
            (state.clone(), too_large),
            explain,
        ))
}

/// A 413 in plain text (tower-http's refusal by `Content-Length`, axum's when a chunked
/// body passes the limit while an extractor reads it) becomes the group's JSON refusal; a
/// handler's own 413 is JSON already and is left as it is.
async fn explain(
    axum::extract::State((state, too_large)): axum::extract::State<(SharedState, TooLarge)>,
    response: Response,
) -> Response {
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !declares_json(response.headers()) {
        return too_large(&state).into_response();
    }
    response.into_response()
}
