//! A request answered before its body was read (a 413, a 415, a 404 with a body) must not
//! break the client's connection in silence. hyper closes a connection whose request body
//! was dropped unread, without saying so: the client's next request on it fails
//! (`BrokenPipe`, `RemoteDisconnected`), and one still sending the body may never read the
//! answer. So a body dropped unread is drained in the background when what is left of it
//! is known and small enough ([`DRAIN_BYTES`], within [`DRAIN_TIME`]): the client finishes
//! sending, reads the answer, and the connection serves its next request. Otherwise the
//! answer says `Connection: close`, as HTTP/1.1 asks of a server that closes.
//!
//! All of this is HTTP/1's. Over HTTP/2 (h2c) a body dropped unread resets its own stream
//! only, which tells the client to stop sending it, and the connection goes on; there
//! `Connection` is no header at all (RFC 9113 §8.2.2), and draining would only read what
//! the reset saves the client from sending.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::header::{CONNECTION, CONTENT_LENGTH};
use axum::http::{HeaderValue, Response, Version};
use axum::middleware::Next;
use http_body::{Frame, SizeHint};

/// The most of an unread body drained to keep its connection (a few times the largest
/// body a JSON route accepts; an upload over the file limit is larger, and is closed).
pub const DRAIN_BYTES: u64 = 64 << 20;

/// How long a drain may take before the connection is given up (a client that stalls).
pub const DRAIN_TIME: Duration = Duration::from_secs(10);

/// What became of a request's body by the time its answer was made.
const READING: u8 = 0;
/// Read to its end (or there was none): the connection is fine.
const FINISHED: u8 = 1;
/// Dropped unread, its rest handed to a drain: the connection is kept.
const DRAINING: u8 = 2;
/// Dropped unread with too much left (or an unknown amount): hyper will close.
const ABANDONED: u8 = 3;

/// Middleware: tracks an HTTP/1 request's body, drains or flags it when it is left unread.
pub async fn keep_or_close(request: Request, next: Next) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let http1 = matches!(parts.version, Version::HTTP_10 | Version::HTTP_11);
    if !http1 || body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let state = Arc::new(AtomicU8::new(READING));
    let tracked = Tracked {
        inner: Some(body),
        left: declared,
        state: state.clone(),
    };
    let mut response = next
        .run(Request::from_parts(parts, Body::new(tracked)))
        .await;
    // READING: the handler still holds the body (it streams it); it says nothing yet.
    if state.load(Ordering::Acquire) == ABANDONED {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The request body, counting down what its `Content-Length` says is left.
struct Tracked {
    inner: Option<Body>,
    /// Bytes still to come, when the request declared its length.
    left: Option<u64>,
    state: Arc<AtomicU8>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                this.state.store(FINISHED, Ordering::Release);
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(left), Some(data)) = (this.left.as_mut(), frame.data_ref()) {
                    *left = left.saturating_sub(data.len() as u64);
                }
                if this.inner.as_ref().is_some_and(Body::is_end_stream) {
                    this.state.store(FINISHED, Ordering::Release);
                }
            }
            // A body that failed (the client went away) leaves a connection hyper closes.
            Poll::Ready(Some(Err(_))) => this.state.store(ABANDONED, Ordering::Release),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        if self.state.load(Ordering::Acquire) != READING || inner.is_end_stream() {
            return;
        }
        let drainable = self.left.is_some_and(|left| left <= DRAIN_BYTES);
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(runtime) if drainable => {
                self.state.store(DRAINING, Ordering::Release);
                runtime.spawn(drain(inner));
            }
            _ => self.state.store(ABANDONED, Ordering::Release),
        }
    }
}

/// Reads and discards the rest of a body, bounded in bytes and time; dropping it past
/// either bound lets hyper close the connection.
async fn drain(mut body: Body) {
    let read = async {
        let mut total = 0u64;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let Ok(frame) = frame else { return };
            if let Some(data) = frame.data_ref() {
                total += data.len() as u64;
                if total > DRAIN_BYTES {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    /// A request whose body is of unknown length (chunked in HTTP/1, any body in HTTP/2),
    /// answered by a handler that never reads it.
    async fn refused_unread(version: Version) -> Response<Body> {
        let app = Router::new()
            .route("/", post(|| async { StatusCode::PAYLOAD_TOO_LARGE }))
            .layer(axum::middleware::from_fn(keep_or_close));
        let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from("{"))]);
        let request = Request::post("/")
            .version(version)
            .body(Body::from_stream(chunks))
            .unwrap();
        app.oneshot(request).await.unwrap()
    }

    #[tokio::test]
    async fn connection_close_is_said_over_http1_only() {
        for version in [Version::HTTP_10, Version::HTTP_11] {
            let response = refused_unread(version).await;
            assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
            assert_eq!(response.headers()[CONNECTION], "close", "{version:?}");
        }
        // A connection-specific header is malformed in HTTP/2 (and HTTP/3): never added.
        for version in [Version::HTTP_2, Version::HTTP_3] {
            let response = refused_unread(version).await;
            assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
            assert_eq!(response.headers().get(CONNECTION), None, "{version:?}");
        }
    }
}
