//! Why a tool call was cancelled, said at the moment it is. A call is cancelled by dropping
//! its future ([`super::toolcalls::ToolHost`]); whoever drops one does so inside
//! [`cancelling`], and a tool whose answer someone outside is working on (a caller tool's
//! client) reads [`current`] in its drop code to tell them why. The drops are synchronous,
//! so the cause is exactly the one of the scope they happen in.
//!
//! Who says which: the run's wait ([`super::drive`]) for a call its program stopped
//! waiting for, for the calls an interrupt or the run's end leaves pending, and for those
//! of a wait that is itself dropped (its run abandoned); the tools' own per-call timeout
//! for a call not answered in time.

/// Why a pending tool call was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelCause {
    /// The program stopped waiting for it (`ToolCancel`: a cancelled asyncio task, an
    /// `asyncio.wait_for` or `asyncio.timeout` that expired).
    ProgramStoppedWaiting,
    /// It was not answered within `tools.call_timeout_ms`.
    CallTimeout,
    /// The run reached its deadline.
    RunTimeout,
    /// The run was cancelled by its client (`DELETE /v1/runs/{run_id}`).
    RunCancelled,
    /// A session's run was interrupted because its client went away.
    ClientGone,
    /// The run's worker died, or was killed for breaking the job protocol.
    WorkerLost,
    /// The run's worker used up its CPU time (`RLIMIT_CPU`, the backstop behind the
    /// wall-clock deadline) and the kernel killed it (`SIGXCPU`).
    CpuTimeLimit,
    /// The run ended (its program finished) while the call was pending.
    RunEnded,
    /// The run was dropped before it ended: a stateless run whose client went away, a
    /// session run whose session was deleted.
    RunAbandoned,
}

impl CancelCause {
    /// The stable name a client maps (the `reason` of a `tool_call_cancelled` event).
    pub fn as_str(self) -> &'static str {
        match self {
            CancelCause::ProgramStoppedWaiting => "program_cancelled",
            CancelCause::CallTimeout => "call_timeout",
            CancelCause::RunTimeout => "run_timeout",
            CancelCause::RunCancelled => "run_cancelled",
            CancelCause::ClientGone => "client_gone",
            CancelCause::WorkerLost => "worker_lost",
            CancelCause::CpuTimeLimit => "cpu_time_limit",
            CancelCause::RunEnded => "run_ended",
            CancelCause::RunAbandoned => "run_abandoned",
        }
    }

    /// What happened, in words.
    pub fn describe(self) -> &'static str {
        match self {
            CancelCause::ProgramStoppedWaiting => {
                "the program stopped waiting for it (its asyncio task was cancelled or timed out)"
            }
            CancelCause::CallTimeout => "it was not answered within tools.call_timeout_ms",
            CancelCause::RunTimeout => "the run reached its time limit (timeout_ms)",
            CancelCause::RunCancelled => "the run was cancelled (DELETE /v1/runs/{run_id})",
            CancelCause::ClientGone => "the run was interrupted: its client went away",
            CancelCause::WorkerLost => "the run's worker died",
            CancelCause::CpuTimeLimit => {
                "the run's worker used up its CPU time (the backstop behind the time limit) and was killed"
            }
            CancelCause::RunEnded => "the run ended while it was pending",
            CancelCause::RunAbandoned => {
                "the run was stopped before it ended (its client went away, or its session was deleted)"
            }
        }
    }
}

tokio::task_local! {
    static CAUSE: CancelCause;
}

/// Runs `drop_calls`, which drops the futures of tool calls, with `cause` as the
/// [`current`] cause.
pub fn cancelling<R>(cause: CancelCause, drop_calls: impl FnOnce() -> R) -> R {
    CAUSE.sync_scope(cause, drop_calls)
}

/// The cause of the cancel being carried out now, if a [`cancelling`] scope says.
pub fn current() -> Option<CancelCause> {
    CAUSE.try_with(|cause| *cause).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Told(std::sync::Arc<std::sync::Mutex<Vec<Option<CancelCause>>>>);

    impl Drop for Told {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(current());
        }
    }

    #[test]
    fn a_drop_sees_the_cause_of_its_scope_and_none_outside() {
        let told = std::sync::Arc::default();
        let (a, b) = (Told(std::sync::Arc::clone(&told)), Told(told.clone()));
        cancelling(CancelCause::RunTimeout, || {
            cancelling(CancelCause::CallTimeout, || drop(a));
        });
        drop(b);
        assert_eq!(
            *told.lock().unwrap(),
            [Some(CancelCause::CallTimeout), None]
        );
    }
}
