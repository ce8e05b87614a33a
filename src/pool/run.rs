//! One job on one worker: send it, capture stdout and stderr as they come, wait for the
//! result or the deadline, kill on timeout (a stateless worker) or interrupt and then kill
//! (a session's worker), and turn what happened into a [`RunVerdict`]. The wait itself is
//! in [`super::drive`].

use std::time::{Duration, Instant};

use serde::Serialize;
use snakecage_worker::frame::FrameError;
use snakecage_worker::protocol::{EXIT_PROTOCOL, ExitStatus, Job, JobRequest, JobResult};
use tokio_util::sync::CancellationToken;

use super::capture::Capture;
use super::drive::{Ending, drive};
use super::events::KillReason;
use super::output_feed::OutputSender;
use super::toolcalls::{CallViolation, RunTools};
use super::worker::{Worker, ZygoteEnd};

/// How a run ended, from the user's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunVerdict {
    /// Exit code 0.
    Ok,
    /// Non-zero exit: an uncaught exception or `sys.exit(n)`.
    Error,
    /// Killed at the deadline (or by the CPU-time backstop).
    Timeout,
    /// Ran out of its memory budget (`MemoryError`).
    MemoryLimit,
    /// Finished, but its output was cut at `max_output_bytes`.
    OutputLimit,
    /// Died without reporting: a signal, a crash, a protocol violation, the zygote dying.
    Killed,
}

impl RunVerdict {
    pub const ALL: [RunVerdict; 6] = [
        RunVerdict::Ok,
        RunVerdict::Error,
        RunVerdict::Timeout,
        RunVerdict::MemoryLimit,
        RunVerdict::OutputLimit,
        RunVerdict::Killed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunVerdict::Ok => "ok",
            RunVerdict::Error => "error",
            RunVerdict::Timeout => "timeout",
            RunVerdict::MemoryLimit => "memory_limit",
            RunVerdict::OutputLimit => "output_limit",
            RunVerdict::Killed => "killed",
        }
    }
}

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A piece of output as it was produced (for streaming responses).
#[derive(Debug, Clone)]
pub struct OutputChunk {
    pub stream: Stream,
    pub data: Vec<u8>,
}

/// How a worker broke the job protocol (it is killed for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolViolation {
    /// Bytes on the job socket that are not a frame, or a message out of place.
    Garbled,
    /// A tool call that breaks the rules of calls in flight.
    ToolCall(CallViolation),
}

impl std::fmt::Display for ProtocolViolation {
    /// What the job socket carried: "its job socket (fd 3) {this}".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolViolation::Garbled => f.write_str("carried bytes that are not a frame"),
            ProtocolViolation::ToolCall(v) => write!(f, "carried {v}"),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunLimits {
    pub timeout: Duration,
    pub max_output_bytes: usize,
    /// The tools user code may call during the run (Code Mode); `None`: none.
    pub tools: Option<RunTools>,
    /// Fired to cancel the run (`DELETE /v1/runs/{id}`): a stateless worker is killed at
    /// once, a session's job is interrupted like at its deadline.
    pub cancel: Option<CancellationToken>,
    /// Background work (a rollover's probe): the job keeps the worker's background
    /// priority (`SCHED_IDLE`), and is raised to normal only if it still runs after this
    /// long, so a saturated host cannot starve it. `None`: a request's job, raised at once.
    pub background: Option<Duration>,
}

#[derive(Debug)]
pub struct RunOutcome {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// `None` when the worker did not exit on its own (timeout, signal).
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub verdict: RunVerdict,
    pub duration: Duration,
    pub result: Option<JobResult>,
    /// The signal that ended the worker, when one did.
    pub signal: Option<i32>,
    /// Why the kernel's out-of-memory killer most likely ended it (a SIGKILL the service
    /// did not send, while the instance's cgroup counted workers killed for memory); its
    /// verdict is then `memory_limit`.
    pub out_of_memory: Option<String>,
    /// The worker's exit status when it exited without reporting a result (`os._exit(n)`,
    /// a C extension's `exit()`): the result, its verdict `killed`, says how it ended.
    pub exited: Option<i32>,
    /// It died with its zygote, which left no exit status of its own: why the zygote
    /// ended (the service shutting down, or the zygote dying), which is why it died.
    pub zygote_end: Option<ZygoteEnd>,
    /// Why the worker was killed before it reported, when it was (for the metrics).
    pub kill: Option<KillReason>,
    /// How it broke the job protocol, when that is why it was killed.
    pub violation: Option<ProtocolViolation>,
    /// Whether its client cancelled it (`DELETE /v1/runs/{id}`), and when.
    pub cancelled: Cancelled,
}

/// Whether, and when, a run was cancelled by its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    No,
    /// While it ran: a stateless run's worker killed, a session's job interrupted (it
    /// reported, `result` is there) or killed after the grace.
    Running,
    /// While it waited in the queue for a slot: no worker took its job, none of its code
    /// ran.
    Queued,
}

impl RunOutcome {
    /// A run its client cancelled while it waited `waited` in the queue for a slot. Like a
    /// stateless run cancelled as it ran, its verdict is `killed`: it ended without a
    /// result.
    pub fn cancelled_in_queue(waited: Duration) -> Self {
        Self {
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            exit_code: None,
            timed_out: false,
            verdict: RunVerdict::Killed,
            duration: waited,
            result: None,
            signal: None,
            out_of_memory: None,
            exited: None,
            zygote_end: None,
            kill: None,
            violation: None,
            cancelled: Cancelled::Queued,
        }
    }
}

/// Failures that leave no result for the user, and nothing of the job outside the worker:
/// the job can be run again on another worker as if this one had never been taken.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the worker was gone before it took the job: {0}")]
    WorkerLost(FrameError),
    /// Killed with its zygote (`PR_SET_PDEATHSIG`), which died while it held the job,
    /// before a byte of output or a tool call came out of it. Also what happens to an idle
    /// worker taken just after its zygote died, before the supervisor read of the death:
    /// the kernel is already killing it, and its job socket takes the job.
    #[error("the worker died with its zygote before anything of its job came out")]
    DiedWithItsZygote {
        /// How long the job ran before it died (from its send): a job run again gets only
        /// what is left of its timeout.
        ran: Duration,
    },
}

/// How long to wait for the zygote to report the exit status of a worker that died.
pub(super) const EXIT_STATUS_WAIT: Duration = Duration::from_secs(2);

/// Runs `job` on `worker`. The worker has been killed when this returns (and, when it
/// died without reporting, its exit awaited), so it must not be given another job.
pub async fn run(
    worker: &mut Worker,
    mut job: Job,
    limits: &RunLimits,
    chunks: Option<OutputSender>,
) -> Result<RunOutcome, RunError> {
    let started = Instant::now();
    if limits.background.is_none() {
        worker.foreground();
    }
    job.timeout_ms = timeout_ms(limits);
    let tool_cap = job.tool_call_cap();
    worker
        .channel
        .send(&JobRequest::Run(job))
        .await
        .map_err(RunError::WorkerLost)?;
    let deadline = tokio::time::Instant::from_std(started + limits.timeout);
    let mut capture = Capture::new(limits.max_output_bytes, chunks);
    let mut buf = vec![0u8; 64 << 10];
    let (ending, calls) = drive(
        worker,
        &mut capture,
        &mut buf,
        deadline,
        None,
        limits,
        tool_cap,
    )
    .await;
    let duration = started.elapsed();
    // A worker that reported exits in the background; one killed mid-job keeps its
    // priority, as its exit is awaited below before the response.
    if matches!(ending, Ending::Reported(_)) {
        worker.background();
    }
    // One job per worker: whatever it does after its result (a daemon thread still
    // writing, say), it does no more. Everything it wrote before its result (or death) is
    // already in the pipes.
    worker.kill();
    capture.drain(worker, &mut buf);

    let violation = match ending {
        Ending::ProtocolViolation(v) => Some(v),
        _ => None,
    };
    if let Some(violation) = violation {
        tracing::warn!(
            worker = worker.id,
            pid = worker.pid,
            "worker violated the job protocol (its job socket {violation}); killed"
        );
    }
    let reported = matches!(ending, Ending::Reported(_));
    let died = ending == Ending::Died;
    let protocol_violation = violation.is_some();
    let cancelled = ending == Ending::Cancelled;
    let mut exited = None;
    let mut out_of_memory = None;
    let (result, signal, exit_code, timed_out) = match ending {
        Ending::Reported(result) => {
            let code = result.exit_code;
            (Some(result), None, Some(code), false)
        }
        Ending::Deadline => (None, None, None, true),
        Ending::Cancelled => (None, None, None, false),
        Ending::Died | Ending::ProtocolViolation(_) => {
            match worker.exit_status(EXIT_STATUS_WAIT).await {
                // SIGXCPU: the CPU-time backstop, a timeout by another clock.
                Some(ExitStatus::Signal(sig)) if sig == libc::SIGXCPU => {
                    (None, Some(sig), None, true)
                }
                Some(ExitStatus::Signal(sig)) => {
                    if sig == libc::SIGKILL && died {
                        out_of_memory = worker.killed_for_memory();
                    }
                    (None, Some(sig), None, false)
                }
                Some(ExitStatus::Code(code)) => {
                    exited = Some(code);
                    (None, None, None, false)
                }
                None => (None, None, None, false),
            }
        }
    };
    // A worker that reported has finished its job and is exiting anyway, so its workspace
    // is not waited on: its exit teardown (~2 ms with pandas mapped) would be added to
    // every request. A worker killed mid-job may be inside a write, so there the exit is
    // awaited before the workspace is read.
    if result.is_none() {
        let _ = worker.exit_status(EXIT_STATUS_WAIT).await;
    }
    calls.cancel(signal == Some(libc::SIGXCPU));
    let zygote_end = if died { worker.zygote_end() } else { None };
    if died && worker.died_with_its_zygote() && !capture.anything_came_out() {
        // Its zygote's death, not its code, ended it, and nothing of the job got out:
        // the caller runs it again on a fresh worker.
        return Err(RunError::DiedWithItsZygote { ran: duration });
    }
    let verdict = match verdict(result.as_ref(), timed_out, capture.truncated()) {
        RunVerdict::Killed if out_of_memory.is_some() => RunVerdict::MemoryLimit,
        verdict => verdict,
    };
    let kill = if reported {
        None
    } else if timed_out {
        Some(KillReason::Timeout)
    } else if protocol_violation {
        Some(KillReason::ProtocolViolation)
    } else if cancelled {
        Some(KillReason::Abandoned)
    } else if out_of_memory.is_some() {
        Some(KillReason::OutOfMemory)
    } else {
        Some(KillReason::Crashed)
    };
    let ((stdout, stdout_truncated), (stderr, stderr_truncated)) = capture.finish();
    Ok(RunOutcome {
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        exit_code,
        timed_out,
        verdict,
        duration,
        result,
        signal,
        out_of_memory,
        exited,
        zygote_end,
        kill,
        violation,
        cancelled: if cancelled {
            Cancelled::Running
        } else {
            Cancelled::No
        },
    })
}

/// How a session's overdue job is stopped: SIGINT (repeated, in case the first one landed
/// between jobs and was discarded), then SIGKILL once `grace` has passed without a result.
pub struct Interrupt<'a> {
    pub grace: Duration,
    /// Interrupts the job before its deadline (the client went away).
    pub now: &'a CancellationToken,
}

/// A session job as it ended. The worker is alive (and keeps its state) unless `lost`.
#[derive(Debug)]
pub struct SessionRun {
    pub outcome: RunOutcome,
    /// The worker died or was killed: the session's state is gone.
    pub lost: Option<String>,
}

/// Runs `job` on a session's worker. At the deadline the job is interrupted
/// (`KeyboardInterrupt`, state kept, `timed_out: true`); a worker that has not answered
/// `interrupt.grace` later is killed, as is one that breaks the protocol. `out_of_cpu_time`
/// says, once the worker is dead, whether its session's CPU-time watchdog killed it.
pub async fn run_in_session(
    worker: &mut Worker,
    mut job: Job,
    limits: &RunLimits,
    chunks: Option<OutputSender>,
    interrupt: Interrupt<'_>,
    out_of_cpu_time: &(dyn Fn() -> bool + Sync),
) -> Result<SessionRun, RunError> {
    let started = Instant::now();
    job.timeout_ms = timeout_ms(limits);
    let tool_cap = job.tool_call_cap();
    worker
        .channel
        .send(&JobRequest::Run(job))
        .await
        .map_err(RunError::WorkerLost)?;
    let deadline = tokio::time::Instant::from_std(started + limits.timeout);
    let mut capture = Capture::new(limits.max_output_bytes, chunks);
    let mut buf = vec![0u8; 64 << 10];
    let (ending, calls) = drive(
        worker,
        &mut capture,
        &mut buf,
        deadline,
        Some(&interrupt),
        limits,
        tool_cap,
    )
    .await;
    let duration = started.elapsed();
    let overdue = tokio::time::Instant::now() >= deadline;
    let reported = matches!(ending, Ending::Reported(_));
    let killed_at_deadline = ending == Ending::Deadline;
    let kill = match ending {
        Ending::Reported(_) => None,
        Ending::Deadline => Some(KillReason::Timeout),
        Ending::ProtocolViolation(_) => Some(KillReason::ProtocolViolation),
        Ending::Died | Ending::Cancelled => Some(KillReason::Crashed),
    };
    if !reported {
        worker.kill();
    }
    capture.drain(worker, &mut buf);
    let mut exited = None;
    let mut zygote_end = None;
    let violation = match ending {
        Ending::ProtocolViolation(v) => Some(v),
        _ => None,
    };
    let died = ending == Ending::Died;
    let mut out_of_memory = None;
    let (result, lost, signal) = match ending {
        Ending::Reported(result) => (Some(result), None, None),
        Ending::Deadline => {
            // Interrupted before its deadline: by its client, who cancelled the run
            // (`DELETE /v1/runs/{id}`) or went away (`Interrupt::now`).
            let cancelled = limits.cancel.as_ref().is_some_and(|c| c.is_cancelled());
            let when = if overdue || !(cancelled || interrupt.now.is_cancelled()) {
                format!("at the {} ms deadline", limits.timeout.as_millis())
            } else if cancelled {
                "when its client cancelled the run".to_owned()
            } else {
                "when its client went away".to_owned()
            };
            (
                None,
                Some(format!(
                    "its worker did not stop within {} ms of being interrupted {when} and was killed",
                    interrupt.grace.as_millis(),
                )),
                None,
            )
        }
        Ending::ProtocolViolation(violation) => {
            tracing::warn!(
                worker = worker.id,
                pid = worker.pid,
                "session worker violated the job protocol (its job socket {violation}); killed"
            );
            (
                None,
                Some("its worker broke the job protocol and was killed".to_owned()),
                None,
            )
        }
        Ending::Died | Ending::Cancelled => {
            // A kill for its CPU-time budget is explained by its session worker, which
            // knows what the budget covered and who enforced it.
            let (signal, why) = match worker.exit_status(EXIT_STATUS_WAIT).await {
                Some(ExitStatus::Signal(libc::SIGKILL))
                    if died && let Some(why) = worker.killed_for_memory() =>
                {
                    let said = format!("its worker was killed by signal 9 (SIGKILL): {why}");
                    out_of_memory = Some(why);
                    (Some(libc::SIGKILL), said)
                }
                Some(status @ ExitStatus::Signal(sig)) => {
                    (Some(sig), format!("its worker {}", how_it_ended(status)))
                }
                Some(status @ ExitStatus::Code(code)) => {
                    exited = Some(code);
                    (None, format!("its worker {}", how_it_ended(status)))
                }
                None => {
                    zygote_end = worker.zygote_end();
                    let why = zygote_end.map_or("its worker exited", lost_with_its_zygote);
                    (None, why.to_owned())
                }
            };
            (None, Some(why), signal)
        }
    };
    if lost.is_some() {
        let _ = worker.exit_status(EXIT_STATUS_WAIT).await;
    }
    calls.cancel(signal == Some(libc::SIGXCPU) || out_of_cpu_time());
    // Interrupted at the deadline, whether it then answered or had to be killed.
    let timed_out = overdue && (reported || killed_at_deadline);
    let exit_code = match &result {
        Some(r) if !timed_out => Some(r.exit_code),
        _ => None,
    };
    let verdict = match &result {
        _ if timed_out => RunVerdict::Timeout,
        None if out_of_memory.is_some() => RunVerdict::MemoryLimit,
        None => RunVerdict::Killed,
        Some(_) => verdict(result.as_ref(), false, capture.truncated()),
    };
    let ((stdout, stdout_truncated), (stderr, stderr_truncated)) = capture.finish();
    Ok(SessionRun {
        outcome: RunOutcome {
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            exit_code,
            timed_out,
            verdict,
            duration,
            result,
            signal,
            out_of_memory,
            exited,
            zygote_end,
            kill,
            violation,
            // Interrupted by its client's cancel (not its deadline): reported
            // (`KeyboardInterrupt`, state kept) or killed after the grace.
            cancelled: if !timed_out && limits.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
                Cancelled::Running
            } else {
                Cancelled::No
            },
        },
        lost,
    })
}

/// The run's time limit as its job carries it, so the worker can end its own work
/// (drawing the figures left open) before the deadline; at least 1 ms (0 would mean none).
fn timeout_ms(limits: &RunLimits) -> u64 {
    u64::try_from(limits.timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// How a worker that died ended, for a session's reason ("its worker {this}"): what its
/// exit status means, not the number alone.
pub fn how_it_ended(status: ExitStatus) -> String {
    match status {
        ExitStatus::Signal(libc::SIGKILL) => "was killed by signal 9 (SIGKILL: sent by the \
             service when its job socket closed or broke, which a job closing or writing to \
             fd 3 causes; by the kernel when memory ran out; or from outside)"
            .to_owned(),
        ExitStatus::Signal(sig) => {
            let name = nix::sys::signal::Signal::try_from(sig).map_or("unknown", |s| s.as_str());
            format!("was killed by signal {sig} ({name})")
        }
        ExitStatus::Code(EXIT_PROTOCOL) => format!(
            "failed (status {EXIT_PROTOCOL}): its job socket broke, which a job closing or \
             writing to fd 3 causes, or it could not serve the request; its own error is in the \
             service's log"
        ),
        ExitStatus::Code(code) => {
            format!("exited with status {code} (os._exit() ends the process at once)")
        }
    }
}

/// Why a session lost its worker with the worker's zygote (a session's reason, "the
/// session is gone: {this}").
pub fn lost_with_its_zygote(end: ZygoteEnd) -> &'static str {
    match end {
        ZygoteEnd::ShutDown => {
            "the service shut down, and its worker was killed once the grace period for \
             in-flight requests had run out"
        }
        ZygoteEnd::Died => {
            "its worker was killed with its zygote, which died: a worker dies with the \
             zygote it was forked from, by design"
        }
    }
}

/// Precedence: a timeout or a memory error explains everything after it; a death without
/// a result is `killed`; a cut output is worth knowing even when the code succeeded.
fn verdict(result: Option<&JobResult>, timed_out: bool, truncated: bool) -> RunVerdict {
    match result {
        _ if timed_out => RunVerdict::Timeout,
        None => RunVerdict::Killed,
        Some(r) if r.memory_error => RunVerdict::MemoryLimit,
        Some(_) if truncated => RunVerdict::OutputLimit,
        Some(r) if r.exit_code == 0 => RunVerdict::Ok,
        Some(_) => RunVerdict::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(exit_code: i32, memory_error: bool) -> JobResult {
        JobResult {
            exit_code,
            memory_error,
            error: None,
            results: Vec::new(),
        }
    }

    #[test]
    fn verdict_precedence() {
        assert_eq!(
            verdict(Some(&result(0, false)), false, false),
            RunVerdict::Ok
        );
        assert_eq!(
            verdict(Some(&result(3, false)), false, false),
            RunVerdict::Error
        );
        assert_eq!(
            verdict(Some(&result(1, true)), false, true),
            RunVerdict::MemoryLimit
        );
        assert_eq!(
            verdict(Some(&result(0, false)), false, true),
            RunVerdict::OutputLimit
        );
        assert_eq!(verdict(None, true, true), RunVerdict::Timeout);
        assert_eq!(verdict(None, false, false), RunVerdict::Killed);
    }
}
