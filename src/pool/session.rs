//! A worker kept for a session: switched to session mode when taken from the pool, then
//! one request at a time (run, reset, inspect) until it is dropped, which kills it. Each
//! request gets a CPU-time budget of its own ([`super::cpu_budget`]), and a worker that
//! uses one up is gone with that said.

use std::path::Path;
use std::time::Duration;

use snakecage_worker::frame::FrameError;
use snakecage_worker::protocol::{ExitStatus, Job, JobRequest, Variable, WorkerMessage};

use super::cpu_budget::CpuBudget;
use super::output_feed::OutputSender;
use super::run::{self, Interrupt, RunError, RunLimits, SessionRun};
use super::worker::{Worker, ZygoteEnd};

/// Why a session's worker can no longer be used; its state is gone.
#[derive(Debug, thiserror::Error)]
pub enum SessionWorkerError {
    #[error(
        "its worker did not answer within {waited:?} (and {grace:?} after an interrupt) and was killed"
    )]
    Unresponsive { waited: Duration, grace: Duration },
    #[error("its worker is gone: {0}")]
    Lost(String),
}

pub struct SessionWorker {
    worker: Worker,
    budget: CpuBudget,
}

/// A session's user globals as its worker described them.
#[derive(Debug, Default)]
pub struct Listed {
    /// The first of them (at most 500, and 50,000 characters of text).
    pub variables: Vec<Variable>,
    /// How many there are.
    pub total: usize,
}

impl SessionWorker {
    /// Tells a fresh worker to keep its namespace and serve requests until dropped.
    pub(super) async fn start(mut worker: Worker, budget: CpuBudget) -> Result<Self, FrameError> {
        worker.foreground();
        worker.channel.send(&JobRequest::StartSession).await?;
        Ok(Self { worker, budget })
    }

    /// The pool generation its worker was forked from.
    pub fn generation(&self) -> u64 {
        self.worker.lease.id
    }

    pub fn pid(&self) -> i32 {
        self.worker.pid
    }

    pub fn workspace_path(&self) -> &Path {
        self.worker.workspace_path()
    }

    pub fn is_alive(&mut self) -> bool {
        self.worker.is_alive()
    }

    /// Why its zygote ended, when the worker died with it.
    pub fn zygote_end(&mut self) -> Option<ZygoteEnd> {
        self.worker.zygote_end()
    }

    /// Why its worker ended between requests (asked once it is found dead: its job socket
    /// closed, or its exit reported), as a session's reason: its zygote's end, its
    /// CPU-time budget between runs (threads a run left spinning), the kernel's
    /// out-of-memory killer (another worker's allocation can make it kill this one, the
    /// largest), or how it exited.
    /// `None` when none of that is known (its exit not reported in time).
    pub async fn why_gone(&mut self) -> Option<String> {
        let status = self.worker.exit_status(run::EXIT_STATUS_WAIT).await;
        if let Some(end) = self.worker.zygote_end() {
            return Some(run::lost_with_its_zygote(end).to_owned());
        }
        let signal = match status {
            Some(ExitStatus::Signal(sig)) => Some(sig),
            _ => None,
        };
        if let Some(why) = self.budget.why_killed(signal, false) {
            return Some(why);
        }
        if signal == Some(libc::SIGKILL)
            && let Some(why) = self.worker.killed_for_memory()
        {
            return Some(format!(
                "its worker was killed by signal 9 (SIGKILL): {why}"
            ));
        }
        Some(format!("its worker {}", run::how_it_ended(status?)))
    }

    /// Runs one job in the session's namespace; see [`run::run_in_session`].
    pub async fn run(
        &mut self,
        job: Job,
        limits: &RunLimits,
        chunks: Option<OutputSender>,
        interrupt: Interrupt<'_>,
    ) -> Result<SessionRun, RunError> {
        self.start_request();
        let budget = &self.budget;
        let out_of_cpu_time = || budget.watchdog_killed();
        let worker = &mut self.worker;
        let mut ran =
            run::run_in_session(worker, job, limits, chunks, interrupt, &out_of_cpu_time).await;
        if let Ok(SessionRun { outcome, lost }) = &mut ran
            && lost.is_some()
            && let Some(why) = self.budget.why_killed(outcome.signal, true)
        {
            *lost = Some(why);
        }
        self.end_request();
        ran
    }

    /// A whole CPU-time budget for the request about to be sent (a worker already over
    /// its budget between requests is killed instead). Should it fail, the worker keeps
    /// the limit it has: never none.
    fn start_request(&mut self) {
        if self.worker.is_alive() {
            let renewed = self.budget.start_request();
            self.log_failure(renewed);
        }
    }

    /// What is left of the budget between requests, once a request has ended.
    fn end_request(&mut self) {
        if self.worker.is_alive() {
            let renewed = self.budget.end_request();
            self.log_failure(renewed);
        }
    }

    /// Logs a limit that could not be moved (not one of a worker already dead).
    fn log_failure(&self, renewed: std::io::Result<()>) {
        match renewed {
            // Dead, not reaped yet: nothing left to limit.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => tracing::warn!(
                worker = self.worker.id,
                pid = self.worker.pid,
                error = %e,
                "could not move a session worker's CPU-time limit; it keeps the one it has"
            ),
            Ok(()) => {}
        }
    }

    /// Clears the session's globals.
    pub async fn reset(
        &mut self,
        timeout: Duration,
        grace: Duration,
    ) -> Result<(), SessionWorkerError> {
        match self.request(JobRequest::Reset, timeout, grace).await? {
            WorkerMessage::ResetDone => Ok(()),
            other => Err(self.violation(&other)),
        }
    }

    /// Lists the session's globals (bounded by the runner) and counts them.
    pub async fn variables(
        &mut self,
        timeout: Duration,
        grace: Duration,
    ) -> Result<Listed, SessionWorkerError> {
        match self.request(JobRequest::Inspect, timeout, grace).await? {
            WorkerMessage::Variables { variables, total } => {
                // The count is the worker's word: never below what it listed.
                let total = usize::try_from(total)
                    .unwrap_or(usize::MAX)
                    .max(variables.len());
                Ok(Listed { variables, total })
            }
            other => Err(self.violation(&other)),
        }
    }

    fn violation(&mut self, got: &WorkerMessage) -> SessionWorkerError {
        self.worker.kill();
        let kind = match got {
            WorkerMessage::Ready { .. } => "ready",
            WorkerMessage::Result(_) => "result",
            WorkerMessage::ResetDone => "reset_done",
            WorkerMessage::Variables { .. } => "variables",
            WorkerMessage::ToolCall(_) => "tool_call",
            WorkerMessage::ToolCancel { .. } => "tool_cancel",
        };
        SessionWorkerError::Lost(format!("it answered with an unexpected {kind} message"))
    }

    /// Its job socket failed with `e`: killed for good, and why it is gone. A socket that
    /// closed means the worker died (killed from outside, the OOM killer, a crash in C):
    /// say how, from its exit status, not which write found the socket closed.
    async fn gone(&mut self, e: FrameError) -> SessionWorkerError {
        let why = match e {
            FrameError::Io(_) | FrameError::Truncated { .. } => {
                match self.worker.exit_status(run::EXIT_STATUS_WAIT).await {
                    Some(status @ ExitStatus::Signal(sig)) => self
                        .budget
                        .why_killed(Some(sig), true)
                        .unwrap_or_else(|| format!("it {}", run::how_it_ended(status))),
                    Some(status) => format!("it {}", run::how_it_ended(status)),
                    None => e.to_string(),
                }
            }
            // A live worker that wrote garbage: a protocol violation.
            e => format!("it broke the job protocol ({e})"),
        };
        self.worker.kill();
        SessionWorkerError::Lost(why)
    }

    /// One request and its reply: interrupted after `timeout`, killed `grace` later; with
    /// a CPU-time budget of its own.
    async fn request(
        &mut self,
        request: JobRequest,
        timeout: Duration,
        grace: Duration,
    ) -> Result<WorkerMessage, SessionWorkerError> {
        self.start_request();
        let reply = self.exchange(request, timeout, grace).await;
        self.end_request();
        reply
    }

    async fn exchange(
        &mut self,
        request: JobRequest,
        timeout: Duration,
        grace: Duration,
    ) -> Result<WorkerMessage, SessionWorkerError> {
        if let Err(e) = self.worker.channel.send(&request).await {
            return Err(self.gone(e).await);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut interrupted = false;
        loop {
            let until = if interrupted {
                deadline + grace
            } else {
                deadline
            };
            tokio::select! {
                msg = self.worker.channel.recv() => return match msg {
                    Ok(Some(msg)) => Ok(msg),
                    Ok(None) => Err(self.gone(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())).await),
                    Err(e) => Err(self.gone(e).await),
                },
                () = tokio::time::sleep_until(until) => {
                    if interrupted {
                        self.worker.kill();
                        return Err(SessionWorkerError::Unresponsive { waited: timeout, grace });
                    }
                    self.worker.interrupt();
                    interrupted = true;
                }
            }
        }
    }
}
