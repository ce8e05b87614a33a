//! The wait of one job: the worker's output, its tool calls and its result or death,
//! against the deadline, an interrupt and a cancel, turned into an [`Ending`]. Every call
//! it cancels is cancelled under its cause ([`cancelling`]).

use std::time::Duration;

use snakecage_worker::frame::FrameError;
use snakecage_worker::protocol::{JobRequest, JobResult, ToolOutcome, ToolResult, WorkerMessage};
use tokio_util::sync::CancellationToken;

use super::cancel_cause::{CancelCause, cancelling};
use super::capture::Capture;
use super::run::{Interrupt, ProtocolViolation, RunLimits, Stream};
use super::toolcalls::{self, InFlight};
use super::worker::{Worker, read_nonblocking};

/// How often an interrupted job is sent SIGINT again during its grace period.
const INTERRUPT_REPEAT: Duration = Duration::from_millis(250);

/// Reads the worker's output until its result, its death, or the deadline. Without
/// `interrupt` the deadline ends the wait (the caller kills); with it, the deadline (or
/// `interrupt.now`) sends SIGINT and the wait goes on for the grace period.
///
/// Tool calls are answered meanwhile (see [`toolcalls`]), up to `tool_cap` pending at
/// once, each as soon as its answer is there: the deadline keeps running while they are
/// pending; a call the program stopped waiting for (`ToolCancel`) is dropped and answered
/// `cancelled`; an interrupt answers them all `cancelled`; an ending drops them, and a result
/// that comes while some are pending is followed by a `cancelled` answer for each. The
/// calls left pending by a wait that is dropped (its run abandoned) are dropped with it;
/// those an ending leaves pending are handed back, to be cancelled once the caller knows
/// why the run ended (a worker that died: its exit status says how).
pub(super) async fn drive(
    worker: &mut Worker,
    capture: &mut Capture,
    buf: &mut [u8],
    deadline: tokio::time::Instant,
    interrupt: Option<&Interrupt<'_>>,
    limits: &RunLimits,
    tool_cap: usize,
) -> (Ending, Pending) {
    let mut calls = Pending {
        calls: InFlight::new(tool_cap),
        cause: CancelCause::RunAbandoned,
    };
    let ending = wait(
        worker,
        capture,
        buf,
        deadline,
        interrupt,
        limits,
        &mut calls.calls,
    )
    .await;
    calls.cause = ending.cancel_cause();
    (ending, calls)
}

/// The calls of a job in flight; those still pending when it is dropped are cancelled
/// with `cause`.
pub(super) struct Pending {
    calls: InFlight,
    cause: CancelCause,
}

impl Pending {
    /// Cancels the calls still pending once the worker's end is known: one killed for its
    /// CPU time (`out_of_cpu_time`: the SIGXCPU of its `RLIMIT_CPU`, or a session budget's
    /// watchdog) was not merely lost, and its calls say so as its verdict does.
    pub(super) fn cancel(mut self, out_of_cpu_time: bool) {
        if out_of_cpu_time {
            self.cause = CancelCause::CpuTimeLimit;
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        cancelling(self.cause, || self.calls.cancel_all());
    }
}

/// [`drive`]'s loop, its calls held by `drive`.
async fn wait(
    worker: &mut Worker,
    capture: &mut Capture,
    buf: &mut [u8],
    deadline: tokio::time::Instant,
    interrupt: Option<&Interrupt<'_>>,
    limits: &RunLimits,
    calls: &mut InFlight,
) -> Ending {
    let mut deadline = deadline;
    let mut interrupted = false;
    let never = CancellationToken::new();
    let interrupt_now = interrupt.map_or(&never, |i| i.now);
    let cancel = limits.cancel.as_ref().unwrap_or(&never);
    // What ends a stateless run at once also ends a send to its worker (a session's run is
    // interrupted instead, and its sends are bounded by the deadline and the grace).
    let stateless_cancel = interrupt.is_none().then_some(cancel);
    // Background work still running after its patience gets normal priority.
    let mut raise_at = limits
        .background
        .map(|patience| tokio::time::Instant::now() + patience);
    loop {
        // One unit of the task's cooperative budget per message: a worker that writes
        // frames faster than they are handled (a flood of cancels, on a slow or loaded
        // host) keeps the socket readable, and without a yield the runtime would never
        // fire the deadline's timer, so the run would outlive its deadline for as long as
        // the flood lasts.
        tokio::task::consume_budget().await;
        // Biased, in this order: the deadline and interrupts first, so output that never
        // stops cannot starve them; then the result; stdout before stderr, so two writes
        // that become readable together are passed on in the order a program made them.
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(deadline) => match interrupt {
                Some(i) if !interrupted => {
                    let cause = CancelCause::RunTimeout;
                    if let Some(ending) = interrupt_job(worker, calls, cause, i.grace, &mut deadline, &mut interrupted).await {
                        return ending;
                    }
                }
                _ => return Ending::Deadline,
            },
            () = cancel.cancelled(), if interrupt.is_none() => return Ending::Cancelled,
            // (Disabled without a time; the expression is built either way.)
            () = tokio::time::sleep_until(raise_at.unwrap_or(deadline)), if raise_at.is_some() => {
                tracing::info!(worker = worker.id, "background job still running: raised to normal priority");
                worker.foreground();
                raise_at = None;
            }
            () = async { tokio::select! {
                () = interrupt_now.cancelled() => {}
                () = cancel.cancelled() => {}
            } }, if !interrupted && interrupt.is_some() => {
                let grace = interrupt.map_or(Duration::ZERO, |i| i.grace);
                // The cancel is `DELETE /v1/runs/{id}`; the interrupt, a client gone.
                let cause = if cancel.is_cancelled() { CancelCause::RunCancelled } else { CancelCause::ClientGone };
                if let Some(ending) = interrupt_job(worker, calls, cause, grace, &mut deadline, &mut interrupted).await {
                    return ending;
                }
            }
            () = tokio::time::sleep(INTERRUPT_REPEAT), if interrupted => worker.interrupt(),
            (id, outcome) = calls.next() => {
                let answer = JobRequest::ToolResult(ToolResult { id, outcome });
                // A worker gone meanwhile is noticed by the next receive.
                if let Some(ending) = send_bounded(worker, &answer, deadline, stateless_cancel).await {
                    return ending;
                }
            }
            msg = worker.channel.recv() => match msg {
                Ok(Some(WorkerMessage::Result(result))) => {
                    // Its own threads' calls still pending were answered in the worker;
                    // a thread of a session's worker blocked reading is woken by these.
                    // Bounded like every answer: a worker that stopped reading has its
                    // result anyway.
                    let _ = cancel_all(worker, calls, CancelCause::RunEnded, toolcalls::ended(), deadline, stateless_cancel).await;
                    return Ending::Reported(result);
                }
                Ok(Some(WorkerMessage::ToolCall(call))) => {
                    if let Err(violation) = calls.admit(&call) {
                        return Ending::ProtocolViolation(ProtocolViolation::ToolCall(violation));
                    }
                    capture.tool_calls += 1;
                    if interrupted {
                        // Past its deadline: no new work is started for it.
                        let answer = JobRequest::ToolResult(toolcalls::cancel_unstarted(limits.tools.as_ref(), call));
                        if let Some(ending) = send_bounded(worker, &answer, deadline, None).await {
                            return ending;
                        }
                    } else {
                        calls.start(limits.tools.as_ref(), call);
                    }
                }
                Ok(Some(WorkerMessage::ToolCancel { id })) => {
                    // Answered once, only while pending: a cancel that crossed its answer,
                    // or one for an id never made, is ignored.
                    if cancelling(CancelCause::ProgramStoppedWaiting, || calls.cancel(id)) {
                        let answer = JobRequest::ToolResult(ToolResult { id, outcome: toolcalls::given_up() });
                        if let Some(ending) = send_bounded(worker, &answer, deadline, stateless_cancel).await {
                            return ending;
                        }
                    }
                }
                // A read that fails is a worker gone: one that exits with an answer it
                // never read resets its socket (`ECONNRESET`), as does a killed one whose
                // threads were still holding it. Only what was read can break the protocol.
                Err(FrameError::Io(_)) | Ok(None) => return Ending::Died,
                Ok(Some(_)) | Err(_) => return Ending::ProtocolViolation(ProtocolViolation::Garbled),
            },
            ready = worker.stdout.readable(), if capture.stdout_open => {
                if let Ok(mut guard) = ready {
                    match guard.try_io(|fd| read_nonblocking(fd, buf)) {
                        Ok(Ok(0)) | Ok(Err(_)) => capture.stdout_open = false,
                        Ok(Ok(n)) => capture.push(Stream::Stdout, &buf[..n]),
                        Err(_would_block) => {}
                    }
                }
            }
            ready = worker.stderr.readable(), if capture.stderr_open => {
                if let Ok(mut guard) = ready {
                    match guard.try_io(|fd| read_nonblocking(fd, buf)) {
                        Ok(Ok(0)) | Ok(Err(_)) => capture.stderr_open = false,
                        Ok(Ok(n)) => capture.push(Stream::Stderr, &buf[..n]),
                        Err(_would_block) => {}
                    }
                }
            }
        }
    }
}

/// Interrupts the job (SIGINT, repeated while `interrupted`), gives it `grace` from now
/// to answer, and answers every pending call `cancelled` (for `cause`): the deadline's
/// interrupt and an early one (`interrupt.now`, a cancel) alike. The ending a send gave,
/// if any.
async fn interrupt_job(
    worker: &mut Worker,
    calls: &mut InFlight,
    cause: CancelCause,
    grace: Duration,
    deadline: &mut tokio::time::Instant,
    interrupted: &mut bool,
) -> Option<Ending> {
    worker.interrupt();
    *interrupted = true;
    *deadline = tokio::time::Instant::now() + grace;
    cancel_all(
        worker,
        calls,
        cause,
        toolcalls::cancelled(),
        *deadline,
        None,
    )
    .await
}

/// Answers every pending call with `outcome` (`cancelled`) and drops its future, which
/// cancels the call (for `cause`): an interrupted job must not stay blocked on a tool.
/// Each answer is sent as [`send_bounded`] sends it; the ending it gives, if any, is
/// returned.
async fn cancel_all(
    worker: &mut Worker,
    calls: &mut InFlight,
    cause: CancelCause,
    outcome: ToolOutcome,
    deadline: tokio::time::Instant,
    cancel: Option<&CancellationToken>,
) -> Option<Ending> {
    for id in cancelling(cause, || calls.cancel_all()) {
        let answer = JobRequest::ToolResult(ToolResult {
            id,
            outcome: outcome.clone(),
        });
        if let Some(ending) = send_bounded(worker, &answer, deadline, cancel).await {
            return Some(ending);
        }
    }
    None
}

/// Sends `request` to the worker, unless the deadline passes (or `cancel` fires) first.
/// A worker's socket buffer is bounded and only the worker empties it: a program that
/// writes calls to fd 3 and never reads their answers would otherwise hold this loop (and
/// with it the deadline, a cancel, the pool slot) for as long as it likes.
async fn send_bounded(
    worker: &mut Worker,
    request: &JobRequest,
    deadline: tokio::time::Instant,
    cancel: Option<&CancellationToken>,
) -> Option<Ending> {
    let cancelled = async {
        match cancel {
            Some(cancel) => cancel.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        () = tokio::time::sleep_until(deadline) => Some(Ending::Deadline),
        () = cancelled => Some(Ending::Cancelled),
        // A worker gone meanwhile is noticed by the next receive.
        _ = worker.channel.send(request) => None,
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ending {
    Reported(JobResult),
    Deadline,
    Died,
    ProtocolViolation(ProtocolViolation),
    /// Cancelled by its client (stateless runs; a session's job is interrupted instead).
    Cancelled,
}

impl Ending {
    /// Why the calls this ending leaves pending are cancelled, as far as the ending says
    /// (a worker's death is `WorkerLost` until its exit status says more).
    fn cancel_cause(&self) -> CancelCause {
        match self {
            Ending::Reported(_) => CancelCause::RunEnded,
            Ending::Deadline => CancelCause::RunTimeout,
            Ending::Died | Ending::ProtocolViolation(_) => CancelCause::WorkerLost,
            Ending::Cancelled => CancelCause::RunCancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use snakecage_worker::protocol::ToolCall;

    use super::*;
    use crate::pool::cancel_cause;
    use crate::pool::toolcalls::{RunTools, ToolFuture, ToolHost};

    /// A tool that never answers, and notes the cause it was cancelled for.
    struct Told(Arc<Mutex<Vec<Option<CancelCause>>>>);

    /// Held by a call's future: its drop is the call's cancel.
    struct Noting(Arc<Mutex<Vec<Option<CancelCause>>>>);

    impl Drop for Noting {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(cancel_cause::current());
        }
    }

    impl ToolHost for Told {
        fn call(&self, _call: ToolCall) -> ToolFuture {
            let noting = Noting(self.0.clone());
            Box::pin(async move {
                let _noting = noting;
                std::future::pending().await
            })
        }
    }

    /// The cause a call left pending by `ending` is cancelled for, once the worker's end
    /// is known (`out_of_cpu_time`: killed for its CPU time).
    fn cause_of(ending: &Ending, out_of_cpu_time: bool) -> Option<CancelCause> {
        let told = Arc::default();
        let mut calls = Pending {
            calls: InFlight::new(1),
            cause: ending.cancel_cause(),
        };
        let tools = RunTools(Arc::new(Told(Arc::clone(&told))));
        let call = ToolCall {
            id: 1,
            name: "t".into(),
            arguments: serde_json::json!({}),
        };
        calls.calls.start(Some(&tools), call);
        calls.cancel(out_of_cpu_time);
        let told = told.lock().unwrap();
        assert_eq!(told.len(), 1, "cancelled once");
        told[0]
    }

    #[test]
    fn a_worker_killed_by_its_cpu_time_cancels_its_calls_for_that() {
        use CancelCause::*;
        assert_eq!(cause_of(&Ending::Died, true), Some(CpuTimeLimit));
        assert_eq!(cause_of(&Ending::Died, false), Some(WorkerLost));
        assert_eq!(cause_of(&Ending::Deadline, false), Some(RunTimeout));
        assert_eq!(cause_of(&Ending::Cancelled, false), Some(RunCancelled));
    }
}
