//! Tool calls during a run (Code Mode), as the pool sees them: the worker sends a
//! `ToolCall` frame and blocks; the run loop hands the call to the run's [`ToolHost`] and
//! keeps reading output and watching the deadline while the answer is pending; the answer
//! goes back as a `ToolResult` frame. One call is pending at a time (the worker blocks on
//! it; a second one is a protocol violation). A run that ends first drops the pending
//! future, which cancels the call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use snakecage_worker::protocol::{ToolCall, ToolErrorKind, ToolOutcome};

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

/// The call being answered: its id and its answer to come.
pub(super) struct Pending {
    pub id: u64,
    pub answer: ToolFuture,
}

/// Starts answering `call`, or answers at once when the run has no tools.
pub(super) fn start(tools: Option<&RunTools>, call: ToolCall) -> Pending {
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
    Pending { id, answer }
}

/// Waits for the pending answer, forever when there is none (for a `select!` branch).
pub(super) async fn answer(pending: &mut Option<Pending>) -> ToolOutcome {
    match pending {
        Some(p) => p.answer.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The answer a pending call gets when its run is interrupted.
pub(super) fn cancelled() -> ToolOutcome {
    ToolOutcome::error(
        ToolErrorKind::Cancelled,
        "the run was interrupted while this call was pending",
    )
}
