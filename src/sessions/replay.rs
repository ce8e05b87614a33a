//! Session recovery (opt-in with `"replay": true`): the journal of what rebuilt a session's
//! state — staged files, successful runs, resets — bounded in runs and bytes, and the
//! replay that rebuilds a lost worker's namespace on a new worker from it.
//!
//! Choices:
//! - Only runs that ended with exit code 0 (and did not time out) are journaled: a failed
//!   run's partial effects are not reproduced.
//! - Staged files are journaled whatever the run did (they were in the workspace for every
//!   later run); a replay stages them again from the store, so a file deleted since makes
//!   the replay fail, saying which.
//! - A reset is journaled as a reset: files written before it still exist after it.
//! - Past its bounds the journal is dropped for good: replaying part of a history would
//!   build a different state. The session goes on; a later loss is final (410).
//! - A journaled run's tool calls are journaled with it, answers included, and a replay
//!   answers them from there: tools are never called again (see [`super::replay_calls`]).
//!   Their arguments and answers count toward the byte bound.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use snakecage_worker::protocol::Job;
use tokio_util::sync::CancellationToken;

use super::replay_calls::{RecordedCall, Recorder, Recording, Replayer};
use crate::files::workspace::StageInput;
use crate::pool::run::{Interrupt, RunLimits, RunVerdict};
use crate::pool::session::SessionWorker;
use crate::pool::toolcalls::RunTools;
use crate::pool::{Pool, PoolError};

/// What a session's journal may hold.
#[derive(Debug, Clone, Copy)]
pub struct ReplayLimits {
    pub max_runs: usize,
    pub max_bytes: usize,
}

#[derive(Debug, Clone)]
enum Entry {
    Stage(Vec<StageInput>),
    Run {
        /// Boxed: a job is the largest thing an entry holds, by far.
        job: Box<Job>,
        limits: RunLimits,
        /// The run's tool calls and their answers; `None`: the run had no tools.
        calls: Option<Vec<RecordedCall>>,
    },
    Reset,
}

#[derive(Debug)]
pub struct Journal {
    entries: Vec<Entry>,
    runs: usize,
    bytes: usize,
    limits: ReplayLimits,
    /// Why the history can no longer be replayed, once it can't.
    overflow: Option<String>,
}

impl Journal {
    pub fn new(limits: ReplayLimits) -> Self {
        Self {
            entries: Vec::new(),
            runs: 0,
            bytes: 0,
            limits,
            overflow: None,
        }
    }

    /// The successful runs a replay would repeat.
    pub fn runs(&self) -> usize {
        self.runs
    }

    /// Why this session can no longer be rebuilt, when it can't.
    pub fn overflow(&self) -> Option<&str> {
        self.overflow.as_deref()
    }

    pub fn stage(&mut self, inputs: &[StageInput]) -> Option<String> {
        if inputs.is_empty() {
            return None;
        }
        let bytes = inputs.iter().map(|i| i.path.len() + i.file_id.len()).sum();
        self.push(Entry::Stage(inputs.to_vec()), bytes, 0)
    }

    /// The run's `tools`, wrapped to record its calls for this journal: `None` when the
    /// run has no tools or the journal has overflowed already (nothing will be replayed).
    pub fn recorder(&self, tools: Option<&RunTools>) -> Option<Arc<Recorder>> {
        if self.overflow.is_some() {
            return None;
        }
        let budget = self.limits.max_bytes.saturating_sub(self.bytes);
        tools.map(|tools| Arc::new(Recorder::new(tools.0.clone(), budget)))
    }

    /// Records a run that succeeded, with its tool calls when it had tools (`recorded`,
    /// from [`Journal::recorder`]). Returns a notice when this is the run that made the
    /// history too long to replay.
    pub fn run(
        &mut self,
        job: &Job,
        limits: &RunLimits,
        recorded: Option<Recording>,
    ) -> Option<String> {
        let bytes = job.code.len()
            + job.stdin.as_ref().map_or(0, String::len)
            + job.entrypoint.as_ref().map_or(0, String::len)
            + job.args.iter().map(String::len).sum::<usize>()
            + recorded.as_ref().map_or(0, |r| r.bytes);
        // A replay runs without the original run's tools and cancel token: they belonged
        // to that request. Its calls are answered from `calls` instead.
        let entry = Entry::Run {
            job: Box::new(job.clone()),
            limits: RunLimits {
                tools: None,
                cancel: None,
                background: None,
                ..limits.clone()
            },
            calls: recorded.map(|r| r.calls),
        };
        self.push(entry, bytes, 1)
    }

    pub fn reset(&mut self) {
        self.push(Entry::Reset, 0, 0);
    }

    fn push(&mut self, entry: Entry, bytes: usize, runs: usize) -> Option<String> {
        if self.overflow.is_some() {
            return None;
        }
        let (runs, bytes) = (self.runs + runs, self.bytes + bytes);
        let over = if runs > self.limits.max_runs {
            Some(format!(
                "its history grew past {} successful runs (sessions.replay_max_runs)",
                self.limits.max_runs
            ))
        } else if bytes > self.limits.max_bytes {
            Some(format!(
                "its history grew past {} bytes of code and tool calls (sessions.replay_max_bytes)",
                self.limits.max_bytes
            ))
        } else {
            None
        };
        if let Some(why) = over {
            self.entries = Vec::new();
            self.overflow = Some(why.clone());
            return Some(format!(
                "This session can no longer be replayed: {why}. It goes on as before, but if \
                 its worker is lost, the session is gone."
            ));
        }
        self.entries.push(entry);
        self.runs = runs;
        self.bytes = bytes;
        None
    }
}

/// Places stored files in a new worker's workspace (the file store lives above this module).
pub trait ReplayStager: Sync {
    /// `Err` says why the files could not be staged.
    fn stage<'a>(
        &'a self,
        workspace: &'a Path,
        inputs: &'a [StageInput],
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
}

/// A new worker with the journal replayed into it.
pub struct Rebuilt {
    pub worker: SessionWorker,
    pub runs: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// No worker now (overload, shutdown): the session can be rebuilt later.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The session cannot be rebuilt: why.
    #[error("{0}")]
    Failed(String),
}

/// Starts a new session worker and replays `journal` into it: `stage` places stored files
/// in its workspace, each run must end as it did the first time (exit code 0).
pub async fn rebuild(
    pool: &Pool,
    journal: &Journal,
    grace: Duration,
    reset_timeout: Duration,
    stager: &impl ReplayStager,
) -> Result<Rebuilt, RebuildError> {
    let failed = RebuildError::Failed;
    if let Some(why) = journal.overflow() {
        return Err(failed(format!("it cannot be replayed: {why}")));
    }
    let mut worker = pool.start_session_worker().await?;
    let total = journal.runs;
    let mut done = 0;
    for entry in &journal.entries {
        match entry {
            Entry::Stage(inputs) => stager
                .stage(worker.workspace_path(), inputs)
                .await
                .map_err(|e| failed(format!("replaying it failed while staging files: {e}")))?,
            Entry::Reset => worker
                .reset(reset_timeout, grace)
                .await
                .map_err(|e| failed(format!("replaying it failed at a reset: {e}")))?,
            Entry::Run { job, limits, calls } => {
                done += 1;
                let replayer = calls
                    .as_deref()
                    .map(|calls| Arc::new(Replayer::new(format!("run {done} of {total}"), calls)));
                let limits = RunLimits {
                    tools: replayer.clone().map(|r| RunTools(r as Arc<_>)),
                    ..limits.clone()
                };
                let never = CancellationToken::new();
                // A call the journal cannot answer interrupts the run: it has diverged.
                let now = replayer.as_ref().map_or(&never, |r| r.stop());
                let interrupt = Interrupt { grace, now };
                let ran = worker
                    .run((**job).clone(), &limits, None, interrupt)
                    .await
                    .map_err(|e| failed(format!("replaying run {done} of {total} failed: {e}")))?;
                if let Some(why) = replayer
                    .as_ref()
                    .and_then(|r| r.diverged().or_else(|| r.unmade()))
                {
                    return Err(failed(why));
                }
                let outcome = &ran.outcome;
                if let Some(lost) = ran.lost {
                    return Err(failed(format!(
                        "replaying run {done} of {total} failed: the new worker was lost too ({lost})"
                    )));
                }
                if outcome.exit_code != Some(0) || outcome.verdict == RunVerdict::Timeout {
                    return Err(failed(format!(
                        "replaying run {done} of {total} failed (verdict {}, exit code {}){}",
                        outcome.verdict.as_str(),
                        outcome
                            .exit_code
                            .map_or_else(|| "none".to_owned(), |c| c.to_string()),
                        last_line(&outcome.stderr)
                            .map(|l| format!(": {l}"))
                            .unwrap_or_default()
                    )));
                }
            }
        }
    }
    Ok(Rebuilt {
        worker,
        runs: total,
    })
}

/// The last non-empty line of a traceback (the exception), cut short.
fn last_line(text: &str) -> Option<String> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    Some(line.chars().take(300).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(code: &str) -> Job {
        Job {
            code: code.into(),
            stdin: None,
            last_line_interactive: true,
            entrypoint: None,
            args: Vec::new(),
            max_bundle_bytes: 0,
            timeout_ms: 0,
            tools: Vec::new(),
            max_concurrent_tool_calls: 1,
        }
    }

    fn limits() -> RunLimits {
        RunLimits {
            timeout: Duration::from_secs(1),
            max_output_bytes: 100,
            ..RunLimits::default()
        }
    }

    #[test]
    fn the_journal_is_dropped_for_good_past_its_run_or_byte_bound() {
        let mut j = Journal::new(ReplayLimits {
            max_runs: 2,
            max_bytes: 1000,
        });
        assert!(j.run(&job("x = 1"), &limits(), None).is_none());
        assert!(j.run(&job("y = 2"), &limits(), None).is_none());
        let notice = j.run(&job("z = 3"), &limits(), None).expect("a notice");
        assert!(notice.contains("replay_max_runs"), "{notice}");
        assert!(j.overflow().unwrap().contains("2 successful runs"));
        assert!(j.entries.is_empty());
        // Once only.
        assert!(j.run(&job("w = 4"), &limits(), None).is_none());

        let mut j = Journal::new(ReplayLimits {
            max_runs: 10,
            max_bytes: 8,
        });
        assert!(j.run(&job("x = 1"), &limits(), None).is_none());
        assert!(
            j.run(&job("y = 22"), &limits(), None)
                .unwrap()
                .contains("replay_max_bytes")
        );
    }

    #[test]
    fn tool_calls_are_journaled_with_their_run_and_count_toward_the_byte_bound() {
        use crate::sessions::replay_calls::RecordedCall;
        use snakecage_worker::protocol::ToolOutcome;

        let mut j = Journal::new(ReplayLimits {
            max_runs: 10,
            max_bytes: 100,
        });
        struct NoTools;
        impl crate::pool::toolcalls::ToolHost for NoTools {
            fn call(
                &self,
                _: snakecage_worker::protocol::ToolCall,
            ) -> crate::pool::toolcalls::ToolFuture {
                Box::pin(std::future::pending())
            }
        }
        let tools = RunTools(Arc::new(NoTools));
        assert!(
            j.recorder(None).is_none(),
            "a run without tools records nothing"
        );
        assert!(j.recorder(Some(&tools)).is_some());
        let call = RecordedCall {
            name: "météo".into(),
            arguments: serde_json::json!({"ville": "Zürich"}),
            answer: Some(ToolOutcome::Ok {
                result: serde_json::json!(21),
            }),
        };
        let small = Recording {
            calls: vec![call.clone()],
            bytes: 40,
        };
        assert!(j.run(&job("x = 1"), &limits(), Some(small)).is_none());
        assert!(matches!(
            &j.entries[..],
            [Entry::Run { calls: Some(calls), .. }] if calls[..] == [call.clone()]
        ));
        assert_eq!(j.bytes, 45);
        // 45 + 5 of code + 51 of calls: past the 100 bytes.
        let big = Recording {
            calls: Vec::new(),
            bytes: 51,
        };
        let notice = j
            .run(&job("y = 2"), &limits(), Some(big))
            .expect("a notice");
        assert!(
            notice.contains("can no longer be replayed") && notice.contains("replay_max_bytes"),
            "{notice}"
        );
        assert!(j.recorder(Some(&tools)).is_none(), "nothing to record for");
    }

    #[test]
    fn a_traceback_is_summed_up_by_its_last_line() {
        let tb = "Traceback (most recent call last):\n  File \"__main__.py\", line 1\nAssertionError: late\n\n";
        assert_eq!(last_line(tb).unwrap(), "AssertionError: late");
        assert_eq!(last_line("\n \n"), None);
    }
}
