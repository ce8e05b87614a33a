//! Every request's id (`x-request-id`, kept when the client sent a plain one) and the
//! tracing span that carries it, so each log line of a request names it.

use axum::body::Body;
use axum::http::Request;

/// The longest client-sent `x-request-id` kept.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Keeps a client's `x-request-id` only when it is a plain token (letters, digits, `-`,
/// `_`, `.`, `:`, at most 128): anything else is dropped and the request gets an id of
/// ours. Before any authentication, an id is written into every log line of the request,
/// where one with spaces and `=` could pass for fields of its own (`path=/v1/admin/…`).
pub(super) async fn drop_unfit_request_id(mut request: Request<Body>) -> Request<Body> {
    let fit = |v: &axum::http::HeaderValue| {
        let b = v.as_bytes();
        !b.is_empty()
            && b.len() <= MAX_REQUEST_ID_LEN
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
    };
    let headers = request.headers_mut();
    if headers.get_all("x-request-id").iter().count() > 1
        || headers.get("x-request-id").is_some_and(|v| !fit(v))
    {
        headers.remove("x-request-id");
    }
    request
}

/// The span every log line of a request is written in: its id, method and path (never its
/// body: code and output are not logged).
pub(super) fn request_span(request: &Request<Body>) -> tracing::Span {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
    )
}
