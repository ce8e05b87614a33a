//! The forwarding middleware: a call on `/v1/sessions/{id}` or `/v1/runs/{id}` or below
//! them, whose session or run another replica owns, is sent there over HTTP and the
//! owner's answer streamed back (request and response bodies are never buffered, so SSE
//! streams pass through as they are written). The caller's headers go along,
//! `Authorization` included: the owner authenticates and scopes the call exactly as if it
//! had been sent there directly. A forwarded call carries [`FORWARDED_BY`] and is never
//! forwarded again. An owner that cannot be reached has lost the session (or the run)
//! with its worker: 410 with a `detail` saying so.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;

use super::{Kind, Route};
use crate::api::SharedState;
use crate::error::ApiError;
use crate::metrics::cluster::ForwardOutcome;

/// Set on a forwarded call: the replica that forwarded it.
pub const FORWARDED_BY: &str = "x-snakecage-forwarded-by";
/// Set on a forwarded call's answer: the replica that served it.
pub const SERVED_BY: &str = "x-snakecage-served-by";

pub async fn middleware(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    let Some((kind, id)) = Kind::id_in(request.uri().path()) else {
        return next.run(request).await;
    };
    let cluster = &state.cluster;
    match cluster.route(kind, id) {
        Route::Local => {
            let mut response = next.run(request).await;
            if let Some(me) = cluster
                .replica()
                .and_then(|r| HeaderValue::from_str(r).ok())
            {
                response.headers_mut().insert(SERVED_BY, me);
            }
            response
        }
        Route::Gone(reason) => gone(kind, id, &reason).into_response(),
        Route::Forward { replica, .. } if request.headers().contains_key(FORWARDED_BY) => {
            let reason = format!(
                "it belongs to replica '{replica}', and the replica that forwarded this call \
                 reached another one (cluster.peers differ between replicas)"
            );
            gone(kind, id, &reason).into_response()
        }
        Route::Forward { replica, base } => {
            let id = id.to_owned();
            forward(&state, kind, &id, &replica, &base, request).await
        }
    }
}

fn gone(kind: Kind, id: &str, reason: &str) -> ApiError {
    match kind {
        Kind::Session => ApiError::Gone(format!(
            "Session '{id}' is gone: {reason}. Its state is lost; create a new session."
        )),
        Kind::Run => ApiError::RunGone(format!(
            "Run '{id}' is gone: {reason}. It ended with its worker; its tool calls cannot \
             be answered and there is nothing to cancel."
        )),
    }
}

async fn forward(
    state: &SharedState,
    kind: Kind,
    id: &str,
    replica: &str,
    base: &str,
    request: Request,
) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let url = format!("{base}{path}");
    let mut headers = without_hop_by_hop(&parts.headers);
    if let Some(me) = state
        .cluster
        .replica()
        .and_then(|r| HeaderValue::from_str(r).ok())
    {
        headers.insert(HeaderName::from_static(FORWARDED_BY), me);
    }
    let sent = state
        .cluster
        .client()
        .request(parts.method, &url)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
    let metrics = &state.metrics.cluster;
    match sent {
        Ok(answer) => {
            metrics.forwarded(ForwardOutcome::Answered, started.elapsed());
            let status = answer.status();
            let headers = without_hop_by_hop(answer.headers());
            let stream = answer.bytes_stream().map_err(std::io::Error::other);
            let mut response = Response::new(Body::from_stream(stream));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        Err(e) => {
            metrics.forwarded(ForwardOutcome::Gone, started.elapsed());
            tracing::warn!(id, replica, %url, error = %e, "forwarding a call to its owner failed");
            let why = if e.is_connect() {
                "cannot be reached"
            } else {
                "broke off the call"
            };
            gone(
                kind,
                id,
                &format!("replica '{replica}', which owns it, {why} ({e})"),
            )
            .into_response()
        }
    }
}

/// `headers` without those that describe one hop only (RFC 9110 §7.6.1) and `Host`.
fn without_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for name in [
        header::CONNECTION,
        header::HOST,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
    ] {
        out.remove(name);
    }
    out.remove("keep-alive");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_stay_behind_and_the_key_goes_along() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert(header::HOST, HeaderValue::from_static("lb:80"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        let out = without_hop_by_hop(&h);
        assert_eq!(out.len(), 1);
        assert_eq!(out[header::AUTHORIZATION], "Bearer k");
    }
}
