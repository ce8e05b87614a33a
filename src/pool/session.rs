//! A worker kept for a session: switched to session mode when taken from the pool, then
//! one request at a time (run, reset, inspect) until it is dropped, which kills it.

use std::path::Path;
use std::time::Duration;

use snakecage_worker::frame::FrameError;
use snakecage_worker::protocol::{ExitStatus, Job, JobRequest, Variable, WorkerMessage};
use tokio::sync::mpsc;

use super::run::{self, Interrupt, OutputChunk, RunError, RunLimits, SessionRun};
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
}

/// A session's user globals as its worker described them.
#[derive(Debug, Default)]
pub struct Listed {
    /// The first of them (the runner describes at most 500).
    pub variables: Vec<Variable>,
    /// How many there are.
    pub total: usize,
}

impl SessionWorker {
    /// Tells a fresh worker to keep its namespace and serve requests until dropped.
    pub(super) async fn start(mut worker: Worker) -> Result<Self, FrameError> {
        worker.foreground();
        worker.channel.send(&JobRequest::StartSession).await?;
        Ok(Self { worker })
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

    /// Runs one job in the session's namespace; see [`run::run_in_session`].
    pub async fn run(
        &mut self,
        job: Job,
        limits: &RunLimits,
        chunks: Option<mpsc::Sender<OutputChunk>>,
        interrupt: Interrupt<'_>,
    ) -> Result<SessionRun, RunError> {
        run::run_in_session(&mut self.worker, job, limits, chunks, interrupt).await
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
                    Some(ExitStatus::Signal(sig)) => format!("it was killed by signal {sig}"),
                    Some(ExitStatus::Code(code)) => format!("it exited with status {code}"),
                    None => e.to_string(),
                }
            }
            // A live worker that wrote garbage: a protocol violation.
            e => format!("it broke the job protocol ({e})"),
        };
        self.worker.kill();
        SessionWorkerError::Lost(why)
    }

    /// One request and its reply: interrupted after `timeout`, killed `grace` later.
    async fn request(
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
