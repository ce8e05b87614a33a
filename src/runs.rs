//! Runs in progress that a client can reach by id: `DELETE /v1/runs/{run_id}` cancels
//! one, `POST /v1/runs/{run_id}/tool_calls/{call_id}` answers a tool call it is waiting
//! on. Each run belongs to the API key that started it; for another key it does not
//! exist (404, like another tenant's files). A run leaves the registry when it ends, and
//! its pending calls with it. In a cluster a run id names the replica that runs it
//! (`run_<replica>_<incarnation>_<random>`, [`crate::cluster::ids`]), so a call on it that
//! lands on another replica is forwarded there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The client's answer to one tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum CallerAnswer {
    Result(Value),
    Error(Value),
}

#[derive(Default)]
pub struct Runs {
    runs: Mutex<HashMap<String, Arc<RunEntry>>>,
    /// What goes between `run_` and the random part of a new id: this replica's id and
    /// incarnation in a cluster, nothing otherwise.
    id_prefix: String,
}

pub struct RunEntry {
    pub id: String,
    owner: Option<String>,
    /// Fired by `DELETE /v1/runs/{id}`.
    pub cancel: CancellationToken,
    pending: Mutex<HashMap<String, oneshot::Sender<CallerAnswer>>>,
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
        self.entry.pending.lock().expect("pending lock").clear();
    }
}

/// Why an answer was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("run '{0}' not found (it ended, or it is not yours)")]
    NoRun(String),
    #[error(
        "tool call '{call}' of run '{run}' is not waiting for an answer (answered already, timed out, or never made)"
    )]
    NotPending { run: String, call: String },
}

impl Runs {
    /// A registry whose run ids carry `id_prefix` after `run_` (see
    /// [`crate::cluster::Cluster::id_prefix`]).
    pub fn with_id_prefix(id_prefix: String) -> Arc<Self> {
        Arc::new(Self {
            runs: Mutex::default(),
            id_prefix,
        })
    }

    /// A new run of `owner` (`None` without API keys), with a fresh id.
    pub fn register(self: &Arc<Self>, owner: Option<&str>) -> RunHandle {
        let entry = Arc::new(RunEntry {
            id: format!("run_{}{}", self.id_prefix, uuid::Uuid::new_v4().simple()),
            owner: owner.map(str::to_owned),
            cancel: CancellationToken::new(),
            pending: Mutex::new(HashMap::new()),
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
        let entry = self
            .get(run, owner)
            .ok_or_else(|| AnswerError::NoRun(run.to_owned()))?;
        let waiter = entry.pending.lock().expect("pending lock").remove(call);
        match waiter.map(|w| w.send(answer)) {
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
            .pending
            .lock()
            .expect("pending lock")
            .remove(&self.call_id);
    }
}

impl RunEntry {
    /// Registers a new call awaiting the client's answer.
    pub fn expect_answer(self: &Arc<Self>) -> PendingCall {
        let call_id = format!("call_{}", uuid::Uuid::new_v4().simple());
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .expect("pending lock")
            .insert(call_id.clone(), tx);
        PendingCall {
            entry: self.clone(),
            call_id,
            answer: rx,
        }
    }

    /// Calls waiting for an answer.
    pub fn pending_calls(&self) -> usize {
        self.pending.lock().expect("pending lock").len()
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
    fn a_dropped_call_is_forgotten() {
        let runs = Arc::new(Runs::default());
        let run = runs.register(None);
        let call = run.entry.expect_answer();
        assert_eq!(run.entry.pending_calls(), 1);
        drop(call);
        assert_eq!(run.entry.pending_calls(), 0);
    }
}
