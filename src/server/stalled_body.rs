//! A request body that stalls: no piece of it arrives for the client timeout
//! (`limits.client_timeout_ms`) while the service waits for one. Its read then fails, so
//! the request is answered (400, saying so) and its connection closed, instead of holding
//! a connection, and a handler, for as long as a client trickles or stops.
//!
//! tower-http's `TimeoutBody` does the same but hides its body's length and end
//! (`size_hint`, `is_end_stream`), which the service reads: a `Content-Length` over the
//! limit is refused before the body is read, and a request whose body ended keeps its
//! connection (`super::unread_body`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::BoxError;
use axum::body::HttpBody;
use http_body::{Frame, SizeHint};

/// A body whose read fails once no piece of it has come for `timeout`.
pub struct StalledBody<B> {
    inner: B,
    timeout: Duration,
    /// Set while a read waits, cleared when a piece comes.
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> StalledBody<B> {
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            waiting: None,
        }
    }
}

/// The error of a stalled body.
#[derive(Debug)]
pub struct Stalled(Duration);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body stalled: nothing of it arrived for {} ms \
             (limits.client_timeout_ms)",
            self.0.as_millis()
        )
    }
}

impl std::error::Error for Stalled {}

impl<B> HttpBody for StalledBody<B>
where
    B: HttpBody + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let waiting = this
                    .waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(Stalled(timeout))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, Bytes};
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_fails_after_the_timeout_and_one_that_flows_does_not() {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let stream = futures_util::stream::unfold(receiver, |mut r| async move {
            r.recv().await.map(|item| (item, r))
        });
        let mut body = StalledBody::new(Body::from_stream(stream), Duration::from_secs(75));
        // Pieces 70 s apart: each within the timeout, which starts again at each.
        for piece in ["{\"code\": ", "\"print('é')\"}"] {
            tokio::time::sleep(Duration::from_secs(70)).await;
            sender.send(Ok(Bytes::from(piece))).await.unwrap();
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), piece);
        }
        // Then nothing: the read fails at 75 s, saying why.
        let started = tokio::time::Instant::now();
        let e = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(75));
        assert_eq!(
            e.to_string(),
            "the request body stalled: nothing of it arrived for 75000 ms \
             (limits.client_timeout_ms)"
        );
        drop(sender);
    }

    #[test]
    fn the_length_and_end_of_the_body_show_through() {
        let body = StalledBody::new(Body::from("données"), Duration::from_secs(1));
        assert_eq!(body.size_hint().exact(), Some("données".len() as u64));
        assert!(!body.is_end_stream());
        let empty = StalledBody::new(Body::empty(), Duration::from_secs(1));
        assert!(empty.is_end_stream());
    }
}
