//! Server-sent events for the `…/execute/stream` routes (Onyx-compatible): `output`
//! events (`{"stream", "data"}`) as the code writes, then exactly one `result` (the same
//! body `/v1/execute` answers) or one `error` (`{"message", "code"}`). A run with tools
//! the caller declared also sends `tool_call` events (`{"run_id", "call_id", "name",
//! "arguments"}`), which the client answers with `POST /v1/runs/{run_id}/tool_calls/{call_id}`,
//! and a `tool_call_cancelled` event (`{"run_id", "call_id", "name", "reason",
//! "message"}`) for each of them cancelled before its answer came, after its `tool_call`
//! and before the `result`.
//!
//! The run goes on in a task whose output reaches the response through an
//! [`output_feed`](crate::pool::output_feed), which never makes the run wait: a client that
//! stops reading holds no worker, slot or session past the run's end (its deadline, a
//! cancel), only the output not yet read, and the result. When the client goes away, axum
//! drops the response stream and with it a [`DisconnectGuard`], which aborts a stateless
//! run (its checkout is dropped: the worker is SIGKILLed) or interrupts a session's run
//! (the session survives). Keep-alive comments every second also make a silent run notice
//! a gone client: writing to a closed socket fails.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::future::Either;
use futures_util::{FutureExt, Stream};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::execute::ExecuteResponse;
use crate::codemode::caller::{CallerEventsRx, ToolCallCancelled, ToolCallEvent};
use crate::error::{ApiError, ErrorCode};
use crate::pool::output_feed::OutputReceiver;
use crate::pool::run::{OutputChunk, Stream as OutputStream};

/// What a client that disconnects mid-stream does to its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDisconnect {
    /// Abort the run: its worker is killed (stateless runs).
    Kill,
    /// Fire the token the run watches: a session's job is interrupted, its state kept.
    Interrupt,
}

struct DisconnectGuard {
    task: Option<tokio::task::AbortHandle>,
    interrupt: CancellationToken,
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        // Harmless once the run has finished.
        self.interrupt.cancel();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

struct StreamState {
    chunks: Option<OutputReceiver>,
    tool_calls: Option<mpsc::Receiver<ToolCallEvent>>,
    cancelled_calls: Option<mpsc::UnboundedReceiver<ToolCallCancelled>>,
    run: Option<JoinHandle<Result<ExecuteResponse, ApiError>>>,
    stdout: Utf8Decoder,
    stderr: Utf8Decoder,
    _guard: DisconnectGuard,
}

/// Streams `run` (which sends its output to the sender of `chunks`) as SSE. `interrupt`
/// is fired when the client disconnects (see [`OnDisconnect`]).
/// `tool_calls`, when given, carries the run's `tool_call` and `tool_call_cancelled`
/// events, interleaved with its output.
///
/// `run` is polled once before the stream starts: a run refused before it waits for
/// anything (the queue is full, the service is shutting down, the session is busy) is
/// answered with that error's status, as on the routes that do not stream, so a client
/// that retries on 429 sees one. Once it waits (for a slot, a worker, its output), the
/// response is the stream and a later failure is its `error` event.
pub fn sse_with_tool_calls(
    chunks: OutputReceiver,
    tool_calls: Option<CallerEventsRx>,
    run: impl Future<Output = Result<ExecuteResponse, ApiError>> + Send + 'static,
    on_disconnect: OnDisconnect,
    interrupt: CancellationToken,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let mut run = Box::pin(run);
    // Not dropped half-way: either it is done, or it moves into its task below.
    let run = match run.as_mut().now_or_never() {
        Some(Err(e)) => return Err(e),
        Some(Ok(done)) => Either::Left(std::future::ready(Ok(done))),
        None => Either::Right(run),
    };
    let run = tokio::spawn(run);
    let guard = DisconnectGuard {
        task: (on_disconnect == OnDisconnect::Kill).then(|| run.abort_handle()),
        interrupt,
    };
    let (tool_calls, cancelled_calls) = match tool_calls {
        Some(rx) => (Some(rx.calls), Some(rx.cancelled)),
        None => (None, None),
    };
    let state = StreamState {
        chunks: Some(chunks),
        tool_calls,
        cancelled_calls,
        run: Some(run),
        stdout: Utf8Decoder::default(),
        stderr: Utf8Decoder::default(),
        _guard: guard,
    };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        while st.chunks.is_some() || st.tool_calls.is_some() || st.cancelled_calls.is_some() {
            // Output first: what a program printed before a call reaches the client first.
            // A call before its cancel: its `tool_call` was queued before the cancel was.
            let next = tokio::select! {
                biased;
                chunk = recv_output(&mut st.chunks), if st.chunks.is_some() => Next::Chunk(chunk),
                call = recv(&mut st.tool_calls), if st.tool_calls.is_some() => Next::Call(call),
                cancelled = recv_unbounded(&mut st.cancelled_calls), if st.cancelled_calls.is_some() => {
                    Next::Cancelled(cancelled)
                }
            };
            let chunk = match next {
                Next::Chunk(chunk) => chunk,
                Next::Call(Some(call)) => {
                    return Some((Ok(json_event("tool_call", &call, "a tool call")), st));
                }
                Next::Call(None) => {
                    st.tool_calls = None;
                    continue;
                }
                Next::Cancelled(Some(cancelled)) => {
                    let event =
                        json_event("tool_call_cancelled", &cancelled, "a tool call's cancel");
                    return Some((Ok(event), st));
                }
                Next::Cancelled(None) => {
                    st.cancelled_calls = None;
                    continue;
                }
            };
            match chunk {
                Some(chunk) => {
                    let decoder = match chunk.stream {
                        OutputStream::Stdout => &mut st.stdout,
                        OutputStream::Stderr => &mut st.stderr,
                    };
                    let text = decoder.push(&chunk.data);
                    if !text.is_empty() {
                        return Some((Ok(output_event(chunk.stream, text)), st));
                    }
                }
                None => st.chunks = None,
            }
        }
        // Bytes of a character the output limit (or the end) cut in half.
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let decoder = match stream {
                OutputStream::Stdout => &mut st.stdout,
                OutputStream::Stderr => &mut st.stderr,
            };
            let text = decoder.finish();
            if !text.is_empty() {
                return Some((Ok(output_event(stream, text)), st));
            }
        }
        let run = st.run.take()?;
        let event = match run.await {
            Ok(Ok(response)) => json_event("result", &response, "the result"),
            Ok(Err(e)) => {
                if let ApiError::Internal(cause) = &e {
                    tracing::error!(%cause, "internal error in a streamed run");
                }
                error_event(&e.to_string(), e.code())
            }
            Err(e) => {
                tracing::error!(error = %e, "a streamed run's task failed");
                error_event("internal error", ErrorCode::InternalError)
            }
        };
        Some((Ok(event), st))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(1))))
}

enum Next {
    Chunk(Option<OutputChunk>),
    Call(Option<ToolCallEvent>),
    Cancelled(Option<ToolCallCancelled>),
}

/// The next chunk of an open feed; never, for a closed one.
async fn recv_output(rx: &mut Option<OutputReceiver>) -> Option<OutputChunk> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The next item of an open channel; never, for a closed one.
async fn recv<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// [`recv`], of an unbounded channel.
async fn recv_unbounded<T>(rx: &mut Option<mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn output_event(stream: OutputStream, data: String) -> Event {
    json_event(
        "output",
        &json!({ "stream": stream, "data": data }),
        "output",
    )
}

/// The event `name` with `data` as its JSON; an `error` event saying that `what` could not
/// be encoded when it cannot be.
fn json_event(name: &str, data: &impl serde::Serialize, what: &str) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| {
            error_event(
                &format!("{what} could not be encoded"),
                ErrorCode::InternalError,
            )
        })
}

fn error_event(message: &str, code: ErrorCode) -> Event {
    Event::default()
        .event("error")
        .json_data(json!({ "message": message, "code": code }))
        .unwrap_or_default()
}

/// Turns a byte stream into text without splitting a UTF-8 character across events.
#[derive(Debug, Default)]
struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let cut = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An incomplete character at the end waits for its other bytes.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let rest = self.pending.split_off(cut);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        text
    }

    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_chunks_is_sent_whole() {
        let mut d = Utf8Decoder::default();
        let bytes = "aé".as_bytes();
        assert_eq!(d.push(&bytes[..2]), "a");
        assert_eq!(d.push(&bytes[2..]), "é");
        assert_eq!(d.push(b"\xff!"), "\u{fffd}!");
        assert_eq!(d.push(&"é".as_bytes()[..1]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }
}
