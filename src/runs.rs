//! Runs in progress that a client can reach by id: `DELETE /v1/runs/{run_id}` cancels
//! one, `POST /v1/runs/{run_id}/tool_calls/{call_id}` answers a tool call it is waiting
//! on. Each run belongs to the API key that started it; for another key it does not
//! exist (404, like another tenant's files). A run leaves the registry when it ends, and
//! its pending calls with it. In a cluster a run id names the replica that runs it
//! (`run_<replica>_<incarnation>_<random>`, [`crate::cluster::ids`]), so a call on it that
//! lands on another replica is forwarded there; a single instance's names the start of
//! the process it belongs to (`run_<incarnation>_<random>`).
//!
//! A call its client was told of and that was cancelled before its answer came is
//! remembered with the [`CancelCause`], so that an answer arriving later is told why it
//! is not wanted: for as long as the run lives, and once it has ended for
//! [`ENDED_KEPT_FOR`] (at most [`ENDED_CALLS_KEPT`] calls of ended runs, the oldest
//! forgotten first; an answer to a forgotten one finds its run unknown).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::pool::cancel_cause::CancelCause;

/// How long the cancelled calls of a run that ended are remembered.
pub const ENDED_KEPT_FOR: Duration = Duration::from_secs(600);
/// The most cancelled calls of ended runs remembered at once.
pub const ENDED_CALLS_KEPT: usize = 10_000;

/// The client's answer to one tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum CallerAnswer {
    Result(Value),
    Error(Value),
}

#[derive(Default)]
pub struct Runs {
    runs: Mutex<HashMap<String, Arc<RunEntry>>>,
    /// The cancelled calls of runs that have ended.
    ended: Mutex<Ended>,
    /// What goes between `run_` and the random part of a new id: this replica's id and
    /// incarnation in a cluster, the incarnation alone otherwise.
    id_prefix: String,
}

pub struct RunEntry {
    pub id: String,
    owner: Option<String>,
    /// Fired by `DELETE /v1/runs/{id}`.
    pub cancel: CancellationToken,
    calls: Mutex<Calls>,
}

/// The calls of one run its client answers.
#[derive(Default)]
struct Calls {
    /// Waiting for their answer.
    pending: HashMap<String, oneshot::Sender<CallerAnswer>>,
    /// Cancelled before their answer came, and why.
    cancelled: HashMap<String, CancelCause>,
}

/// The cancelled calls of ended runs, oldest first.
#[derive(Default)]
struct Ended {
    runs: HashMap<String, EndedRun>,
    order: VecDeque<String>,
    calls: usize,
}

struct EndedRun {
    owner: Option<String>,
    ended: Instant,
    cancelled: HashMap<String, CancelCause>,
}

impl Ended {
    fn insert(&mut self, id: String, run: EndedRun, now: Instant) {
        self.calls += run.cancelled.len();
        self.order.push_back(id.clone());
        self.runs.insert(id, run);
        self.forget_old(now);
    }

    /// Forgets the runs that ended more than [`ENDED_KEPT_FOR`] ago, and the oldest
    /// while more than [`ENDED_CALLS_KEPT`] calls are kept.
    fn forget_old(&mut self, now: Instant) {
        while let Some(oldest) = self.order.front() {
            let run = &self.runs[oldest];
            if now.duration_since(run.ended) <= ENDED_KEPT_FOR && self.calls <= ENDED_CALLS_KEPT {
                return;
            }
            self.calls -= run.cancelled.len();
            self.runs.remove(oldest);
            self.order.pop_front();
        }
    }

    /// Why call `call` of `owner`'s ended run `run` was cancelled, if it is remembered.
    fn cause(
        &mut self,
        run: &str,
        call: &str,
        owner: Option<&str>,
        now: Instant,
    ) -> Option<CancelCause> {
        self.forget_old(now);
        let run = self.runs.get(run).filter(|r| r.owner.as_deref() == owner)?;
        run.cancelled.get(call).copied()
    }
}

/// Registered for as long as it lives; dropping it removes the run (its pending calls
/// are dropped: their waiters see the run gone).
pub struct RunHandle {
    runs: Arc<Runs>,
    pub entry: Arc<RunEntry>,
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        self.runs
            .runs
            .lock()
            .expect("runs lock")
            .remove(&self.entry.id);
        let cancelled = {
            let mut calls = self.entry.calls.lock().expect("calls lock");
            calls.pending.clear();
            std::mem::take(&mut calls.cancelled)
        };
        if !cancelled.is_empty() {
            let now = Instant::now();
            let run = EndedRun {
                owner: self.entry.owner.clone(),
                ended: now,
                cancelled,
            };
            let mut ended = self.runs.ended.lock().expect("ended runs lock");
            ended.insert(self.entry.id.clone(), run, now);
        }
    }
}

/// Why an answer was not taken.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("run '{0}' not found (it ended, or it is not yours)")]
    NoRun(String),
    #[error(
        "tool call '{call}' of run '{run}' is not waiting for an answer (answered already, or never made)"
    )]
    NotPending { run: String, call: String },
    #[error(
        "tool call '{call}' of run '{run}' was cancelled ({}): {}; it takes no answer",
        cause.as_str(),
        cause.describe()
    )]
    Cancelled {
        run: String,
        call: String,
        cause: CancelCause,
    },
}

impl Runs {
    /// A registry whose run ids carry `id_prefix` after `run_` (see
    /// [`crate::cluster::Cluster::id_prefix`]).
    pub fn with_id_prefix(id_prefix: String) -> Arc<Self> {
        Arc::new(Self {
            id_prefix,
            ..Self::default()
        })
    }

    /// A new run of `owner` (`None` without API keys), with a fresh id.
    pub fn register(self: &Arc<Self>, owner: Option<&str>) -> RunHandle {
        let entry = Arc::new(RunEntry {
            id: format!("run_{}{}", self.id_prefix, uuid::Uuid::new_v4().simple()),
            owner: owner.map(str::to_owned),
            cancel: CancellationToken::new(),
            calls: Mutex::default(),
        });
        self.runs
            .lock()
            .expect("runs lock")
            .insert(entry.id.clone(), entry.clone());
        RunHandle {
            runs: self.clone(),
            entry,
        }
    }

    /// The run `id` if `owner` started it.
    pub fn get(&self, id: &str, owner: Option<&str>) -> Option<Arc<RunEntry>> {
        let runs = self.runs.lock().expect("runs lock");
        runs.get(id)
            .filter(|r| r.owner.as_deref() == owner)
            .cloned()
    }

    /// Cancels `owner`'s run `id`; false when there is none.
    pub fn cancel(&self, id: &str, owner: Option<&str>) -> bool {
        match self.get(id, owner) {
            Some(run) => {
                run.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Delivers the answer to call `call` of `owner`'s run `run`.
    pub fn answer(
        &self,
        run: &str,
        call: &str,
        owner: Option<&str>,
        answer: CallerAnswer,
    ) -> Result<(), AnswerError> {
        let cancelled = |cause| AnswerError::Cancelled {
            run: run.to_owned(),
            call: call.to_owned(),
            cause,
        };
        let Some(entry) = self.get(run, owner) else {
            let mut ended = self.ended.lock().expect("ended runs lock");
            return Err(match ended.cause(run, call, owner, Instant::now()) {
                Some(cause) => cancelled(cause),
                None => AnswerError::NoRun(run.to_owned()),
            });
        };
        let mut calls = entry.calls.lock().expect("calls lock");
        if let Some(cause) = calls.cancelled.get(call) {
            return Err(cancelled(*cause));
        }
        match calls.pending.remove(call).map(|w| w.send(answer)) {
            Some(Ok(())) => Ok(()),
            _ => Err(AnswerError::NotPending {
                run: run.to_owned(),
                call: call.to_owned(),
            }),
        }
    }

    /// Runs with a tool call waiting for its client's answer (the status page).
    pub fn waiting_on_caller(&self) -> usize {
        let runs = self.runs.lock().expect("runs lock");
        runs.values().filter(|r| r.pending_calls() > 0).count()
    }

    /// Runs in progress.
    pub fn active(&self) -> usize {
        self.runs.lock().expect("runs lock").len()
    }
}

/// A call waiting for the client; dropping it (answered, timed out, run ended) forgets
/// the call, so a late answer is refused.
pub struct PendingCall {
    entry: Arc<RunEntry>,
    pub call_id: String,
    pub answer: oneshot::Receiver<CallerAnswer>,
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.entry
            .calls
            .lock()
            .expect("calls lock")
            .pending
            .remove(&self.call_id);
    }
}

impl RunEntry {
    /// Registers a new call awaiting the client's answer.
    pub fn expect_answer(self: &Arc<Self>) -> PendingCall {
        let call_id = format!("call_{}", uuid::Uuid::new_v4().simple());
        let (tx, rx) = oneshot::channel();
        self.calls
            .lock()
            .expect("calls lock")
            .pending
            .insert(call_id.clone(), tx);
        PendingCall {
            entry: self.clone(),
            call_id,
            answer: rx,
        }
    }

    /// Calls waiting for an answer.
    pub fn pending_calls(&self) -> usize {
        self.calls.lock().expect("calls lock").pending.len()
    }

    /// Cancels call `call_id` for `cause`, if it is still waiting for its answer: an
    /// answer to it is refused from now on, saying why. False when it is not waiting (its
    /// answer came first).
    pub fn cancel_call(&self, call_id: &str, cause: CancelCause) -> bool {
        let mut calls = self.calls.lock().expect("calls lock");
        if calls.pending.remove(call_id).is_none() {
            return false;
        }
        calls.cancelled.insert(call_id.to_owned(), cause);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_reach_their_call_once_and_only_for_the_owner() {
        let runs = Arc::new(Runs::default());
        let run = runs.register(Some("alice"));
        let id = run.entry.id.clone();
        let mut call = run.entry.expect_answer();
        let call_id = call.call_id.clone();
        assert_eq!(
            runs.answer(&id, &call_id, Some("bob"), CallerAnswer::Result(1.into())),
            Err(AnswerError::NoRun(id.clone()))
        );
        runs.answer(&id, &call_id, Some("alice"), CallerAnswer::Result(1.into()))
            .unwrap();
        assert_eq!(
            (&mut call.answer).await.unwrap(),
            CallerAnswer::Result(1.into())
        );
        assert!(matches!(
            runs.answer(&id, &call_id, Some("alice"), CallerAnswer::Result(2.into())),
            Err(AnswerError::NotPending { .. })
        ));
        assert!(!runs.cancel(&id, None));
        assert!(runs.cancel(&id, Some("alice")));
        assert!(run.entry.cancel.is_cancelled());
        drop(run);
        assert_eq!(runs.active(), 0);
        assert!(runs.get(&id, Some("alice")).is_none());
    }

    #[test]
    fn a_cancelled_call_refuses_its_answer_saying_why_while_its_run_lives_and_after() {
        let runs = Arc::new(Runs::default());
        let run = runs.register(Some("alice"));
        let id = run.entry.id.clone();
        let call = run.entry.expect_answer();
        let call_id = call.call_id.clone();
        assert!(run.entry.cancel_call(&call_id, CancelCause::RunTimeout));
        // Once: the first cause is the one.
        assert!(!run.entry.cancel_call(&call_id, CancelCause::RunEnded));
        drop(call);
        assert_eq!(run.entry.pending_calls(), 0);
        let answer = |owner| runs.answer(&id, &call_id, owner, CallerAnswer::Result(1.into()));
        let refusal = AnswerError::Cancelled {
            run: id.clone(),
            call: call_id.clone(),
            cause: CancelCause::RunTimeout,
        };
        let cancelled = Err(refusal.clone());
        assert_eq!(answer(Some("alice")), cancelled);
        assert_eq!(answer(Some("bob")), Err(AnswerError::NoRun(id.clone())));
        drop(run);
        assert_eq!(answer(Some("alice")), cancelled);
        assert_eq!(answer(Some("bob")), Err(AnswerError::NoRun(id.clone())));
        let other = runs.answer(&id, "call_x", Some("alice"), CallerAnswer::Result(1.into()));
        assert_eq!(other, Err(AnswerError::NoRun(id.clone())));
        assert_eq!(
            refusal.to_string(),
            format!(
                "tool call '{call_id}' of run '{id}' was cancelled (run_timeout): the run \
                 reached its time limit (timeout_ms); it takes no answer"
            )
        );
    }

    #[tokio::test]
    async fn a_call_answered_first_is_not_cancelled() {
        let runs = Arc::new(Runs::default());
        let run = runs.register(None);
        let mut call = run.entry.expect_answer();
        runs.answer(
            &run.entry.id,
            &call.call_id,
            None,
            CallerAnswer::Error(1.into()),
        )
        .unwrap();
        assert!(
            !run.entry
                .cancel_call(&call.call_id, CancelCause::CallTimeout)
        );
        assert_eq!(
            (&mut call.answer).await.unwrap(),
            CallerAnswer::Error(1.into())
        );
    }

    #[test]
    fn the_cancelled_calls_of_ended_runs_are_forgotten_after_a_while_or_past_a_count() {
        let start = Instant::now();
        let run = |calls: usize| EndedRun {
            owner: None,
            ended: start,
            cancelled: (0..calls)
                .map(|i| (format!("c{i}"), CancelCause::RunEnded))
                .collect(),
        };
        let mut ended = Ended::default();
        ended.insert("a".into(), run(ENDED_CALLS_KEPT - 1), start);
        ended.insert("b".into(), run(1), start);
        assert_eq!(
            ended.cause("a", "c0", None, start),
            Some(CancelCause::RunEnded)
        );
        assert_eq!(ended.cause("a", "c0", Some("alice"), start), None);
        // One call too many: the oldest run goes.
        ended.insert("c".into(), run(1), start);
        assert_eq!(ended.cause("a", "c0", None, start), None);
        assert_eq!(
            ended.cause("b", "c0", None, start),
            Some(CancelCause::RunEnded)
        );
        let later = start + ENDED_KEPT_FOR + Duration::from_secs(1);
        assert_eq!(ended.cause("c", "c0", None, later), None);
        assert_eq!(
            (ended.runs.len(), ended.order.len(), ended.calls),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_dropped_call_is_forgotten() {
        let runs = Arc::new(Runs::default());
        let run = runs.register(None);
        let call = run.entry.expect_answer();
        assert_eq!(run.entry.pending_calls(), 1);
        drop(call);
        assert_eq!(run.entry.pending_calls(), 0);
    }
}
