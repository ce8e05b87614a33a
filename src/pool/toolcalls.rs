//! Tool calls during a run (Code Mode), as the pool sees them: the worker sends a
//! `ToolCall` frame for each call of any of its threads; the run loop hands each call to
//! the run's [`ToolHost`] and keeps reading output and watching the deadline while the
//! answers are pending; each answer goes back as a `ToolResult` frame with the call's id,
//! as soon as it is there, in whatever order the calls complete.
//!
//! Up to the job's cap (`tools.max_concurrent_calls`, sent with the job) calls are pending
//! at once ([`InFlight`]). The worker holds a call past the cap until a slot is free, so
//! one more, or an id that is already pending, is a protocol violation (the worker is
//! killed). An interrupt answers every pending call `cancelled`; a run that ends drops the
//! pending futures, which cancels the calls, and a session's worker is sent a `cancelled`
//! answer for each after its result (a thread of it may be blocked reading the socket).
//! A `ToolCancel` from the worker (the program stopped waiting for a call) drops that call
//! and answers it `cancelled`, which frees its slot; a cancel of an id not pending (the
//! answer crossed it on the way: a natural race) is ignored, so no id is answered twice,
//! and a flood of them costs a scan of the short pending list each and keeps nothing.
//! Dropping a call's future is how every cancel reaches the [`ToolHost`], which counts
//! the call `cancelled`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use snakecage_worker::jsondepth::{self, MAX_TOOL_JSON_DEPTH};
use snakecage_worker::protocol::{ToolCall, ToolErrorKind, ToolOutcome, ToolResult};

/// The answer to one call, still to come.
pub type ToolFuture = Pin<Box<dyn Future<Output = ToolOutcome> + Send>>;

/// Answers the tool calls of one run: checks them (name, schema, limits), dispatches them
/// to their provider, bounds their time. Implemented outside the pool.
pub trait ToolHost: Send + Sync {
    /// Starts answering `call`. Dropping the future cancels the call.
    fn call(&self, call: ToolCall) -> ToolFuture;
}

/// The tools of one run, if it has any.
#[derive(Clone)]
pub struct RunTools(pub Arc<dyn ToolHost>);

impl fmt::Debug for RunTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RunTools")
    }
}

/// The calls of one run being answered, by id, up to the job's cap.
///
/// A plain list, every future polled whenever the run loop is: the cap keeps it short,
/// and a call answered on another thread is passed on without a detour through a
/// second waker (a `FuturesUnordered` here cost ~20 µs per HTTP call in
/// `cargo bench --bench tools`).
pub(super) struct InFlight {
    cap: usize,
    pending: Vec<(u64, ToolFuture)>,
}

/// How a worker's tool call broke the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallViolation {
    /// A call with the id of one still pending.
    DuplicateId(u64),
    /// One call more than the job's cap in flight at once.
    OverCap(usize),
    /// A call with an argument nested this deep, past [`MAX_TOOL_JSON_DEPTH`]: the worker
    /// refuses such a call itself, so only code writing to the job socket sends one.
    TooDeep(usize),
}

impl fmt::Display for CallViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallViolation::DuplicateId(id) => write!(
                f,
                "a tool call with id {id} while a call with that id was pending"
            ),
            CallViolation::OverCap(cap) => write!(
                f,
                "more tool calls in flight at once than the {cap} allowed \
                 (tools.max_concurrent_calls)"
            ),
            CallViolation::TooDeep(depth) => write!(
                f,
                "a tool call with an argument nested {depth} levels deep, past the \
                 {MAX_TOOL_JSON_DEPTH} a worker sends"
            ),
        }
    }
}

impl InFlight {
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            pending: Vec::new(),
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Checks `call` against the calls pending: a duplicate id, one past the cap or one
    /// nested deeper than a worker sends breaks the protocol. Nothing is started for it.
    pub fn admit(&self, call: &ToolCall) -> Result<(), CallViolation> {
        let depth = match jsondepth::deepest_member(&call.arguments) {
            Some((_, depth)) => depth,
            None => jsondepth::value_depth(&call.arguments),
        };
        if depth > MAX_TOOL_JSON_DEPTH {
            return Err(CallViolation::TooDeep(depth));
        }
        if self.pending.iter().any(|(id, _)| *id == call.id) {
            return Err(CallViolation::DuplicateId(call.id));
        }
        if self.pending.len() >= self.cap {
            return Err(CallViolation::OverCap(self.cap));
        }
        Ok(())
    }

    /// Starts answering an admitted `call`, or answers at once when the run has no tools.
    pub fn start(&mut self, tools: Option<&RunTools>, call: ToolCall) {
        let id = call.id;
        let answer: ToolFuture = match tools {
            Some(tools) => tools.0.call(call),
            None => {
                let name = call.name;
                Box::pin(async move {
                    ToolOutcome::error(
                        ToolErrorKind::UnknownTool,
                        format!("unknown tool '{name}': this run has no tools"),
                    )
                })
            }
        };
        self.pending.push((id, answer));
    }

    /// The next answer, in the order they complete; forever while none is pending (for a
    /// `select!` branch).
    pub async fn next(&mut self) -> (u64, ToolOutcome) {
        std::future::poll_fn(|cx| {
            for i in 0..self.pending.len() {
                if let Poll::Ready(outcome) = self.pending[i].1.as_mut().poll(cx) {
                    let (id, _) = self.pending.swap_remove(i);
                    return Poll::Ready((id, outcome));
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Drops call `id` (which cancels it), if it is pending: true when it was, and is now
    /// to be answered. A cancel of an id not pending changes nothing.
    pub fn cancel(&mut self, id: u64) -> bool {
        match self.pending.iter().position(|(pending, _)| *pending == id) {
            Some(at) => {
                drop(self.pending.swap_remove(at));
                true
            }
            None => false,
        }
    }

    /// Drops every pending call (which cancels it) and returns their ids, to be answered.
    pub fn cancel_all(&mut self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.pending.drain(..).map(|(id, _)| id).collect();
        ids.sort_unstable();
        ids
    }
}

/// The answer every pending call gets when its run is interrupted.
pub(super) fn cancelled() -> ToolOutcome {
    ToolOutcome::error(
        ToolErrorKind::Cancelled,
        "the run was interrupted while this call was pending",
    )
}

/// The answer to `call`, made after its run was interrupted: `cancelled`, and nothing is
/// started for it. Its future is made and dropped unpolled, which dispatches nothing and
/// lets the tools count the call (as `cancelled`, or as whatever refused it).
pub(super) fn cancel_unstarted(tools: Option<&RunTools>, call: ToolCall) -> ToolResult {
    let id = call.id;
    if let Some(tools) = tools {
        drop(tools.0.call(call));
    }
    ToolResult {
        id,
        outcome: cancelled(),
    }
}

/// The answer to a call its program stopped waiting for (`ToolCancel`).
pub(super) fn given_up() -> ToolOutcome {
    ToolOutcome::error(
        ToolErrorKind::Cancelled,
        "the program stopped waiting for this call",
    )
}

/// The answer the calls still pending at a job's result get (the worker answered them
/// already: this wakes a thread of it that is blocked reading).
pub(super) fn ended() -> ToolOutcome {
    ToolOutcome::error(
        ToolErrorKind::Cancelled,
        "the run ended while this call was pending",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: u64) -> ToolCall {
        ToolCall {
            id,
            name: "t".into(),
            arguments: json!({}),
        }
    }

    struct Echo;

    impl ToolHost for Echo {
        fn call(&self, call: ToolCall) -> ToolFuture {
            Box::pin(async move {
                // The lower ids answer later: the answers come back in completion order.
                for _ in 0..(10 - call.id) {
                    tokio::task::yield_now().await;
                }
                ToolOutcome::Ok {
                    result: json!(call.id),
                }
            })
        }
    }

    #[tokio::test]
    async fn calls_are_pending_together_up_to_the_cap_and_answered_as_they_complete() {
        let tools = RunTools(Arc::new(Echo));
        let mut in_flight = InFlight::new(3);
        for id in [1, 2, 3] {
            in_flight.admit(&call(id)).unwrap();
            in_flight.start(Some(&tools), call(id));
        }
        assert_eq!(
            in_flight.admit(&call(2)),
            Err(CallViolation::DuplicateId(2))
        );
        assert_eq!(in_flight.admit(&call(4)), Err(CallViolation::OverCap(3)));
        let nested = |levels| (0..levels).fold(json!(0), |inner, _| json!([inner]));
        let mut deep = call(5);
        deep.arguments = json!({"flat": 1, "deep": nested(MAX_TOOL_JSON_DEPTH + 1)});
        assert_eq!(
            InFlight::new(3).admit(&deep),
            Err(CallViolation::TooDeep(MAX_TOOL_JSON_DEPTH + 1))
        );
        deep.arguments = json!({"deepest": nested(MAX_TOOL_JSON_DEPTH)});
        assert_eq!(InFlight::new(3).admit(&deep), Ok(()));
        let mut order = Vec::new();
        for _ in 0..3 {
            order.push(in_flight.next().await.0);
        }
        assert_eq!(order, [3, 2, 1]);
        assert!(in_flight.is_empty());
        in_flight.admit(&call(2)).unwrap();
        in_flight.start(None, call(2));
        in_flight.start(Some(&tools), call(7));
        in_flight.start(Some(&tools), call(8));
        // One cancelled by its program: once, and only while it is pending.
        assert!(in_flight.cancel(8));
        assert!(!in_flight.cancel(8));
        assert!(!in_flight.cancel(99));
        assert_eq!(in_flight.cancel_all(), [2, 7]);
        assert!(in_flight.is_empty());
    }
}
