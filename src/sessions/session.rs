//! One session: its usage (expiry), its state behind a lock (worker, workspace baseline,
//! replay journal), and what the API reports about it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use tokio::sync::{OwnedMutexGuard, watch};
use tokio_util::sync::CancellationToken;

use super::SessionError;
use super::replay::Journal;
use crate::files::workspace::Staged;
use crate::pool::session::SessionWorker;

/// The part of a session every request may read without waiting for a run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Usage {
    pub(super) last_used: SystemTime,
    pub(super) last_used_at: Instant,
    pub(super) execution_count: u64,
}

pub struct Session {
    pub id: String,
    /// The API key (tenant) that created it; only it can reach the session.
    pub owner: Option<String>,
    pub created_at: SystemTime,
    /// Created with `replay`: a lost worker is rebuilt from the journal.
    pub replay: bool,
    pub(super) ttl: Duration,
    pub(super) usage: Mutex<Usage>,
    pub(super) state: Arc<tokio::sync::Mutex<SessionState>>,
    /// `true` while a run (or a reset) holds `state` or waits for it. A second one is
    /// refused as busy; a read that finds it set says the session is busy instead of
    /// waiting for a run. A read holds `state` only briefly, so a run waits for it.
    pub(super) claimed: watch::Sender<bool>,
    /// The pool generation its worker was forked from (a rebuilt worker's, after a replay).
    pub(super) generation: AtomicU64,
    /// Fired when the session is deleted, evicted or expires: a run in progress is killed.
    pub ended: CancellationToken,
}

/// What a request on a session works with, one request at a time.
pub struct SessionState {
    /// `None` once the worker is lost; `dead` (or, for a replay session, `lost`) says why.
    pub worker: Option<SessionWorker>,
    pub dead: Option<String>,
    /// A replay session whose worker was lost: why. It is rebuilt before the next run.
    pub lost: Option<String>,
    /// What rebuilds a replay session (`None` without `replay`).
    pub journal: Option<Journal>,
    /// The workspace as the last run left it: files reported once are not reported again
    /// unless they change.
    pub baseline: Staged,
}

/// A summary for listings and `GET /v1/sessions/{id}`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub created_at: String,
    pub last_used_at: String,
    pub expires_at: String,
    pub execution_count: u64,
    /// `idle`, `busy`, `dead`, or `replay_pending` (a replay session whose worker was
    /// lost: it is rebuilt before its next run).
    pub status: &'static str,
    /// Whether the session was created with `replay`.
    pub replay: bool,
    /// The zygote generation its worker runs on: the one current when it was created
    /// (a rollover does not move a session; it keeps its generation until it ends).
    pub generation: u64,
}

/// The session's state in one line a chat UI can show, on every session run's response.
#[derive(Debug, Clone, Serialize)]
pub struct SessionIndicator {
    /// How many user globals the session holds.
    pub variables: usize,
    pub names: Vec<String>,
    /// When the session expires if it is not used again.
    pub expires_at: String,
}

impl Session {
    pub(super) fn usage(&self) -> Usage {
        *self.usage.lock().expect("usage lock")
    }

    /// Marks a use (pushing expiry back); `executed` counts a run.
    pub fn touch(&self, executed: bool) {
        let mut usage = self.usage.lock().expect("usage lock");
        usage.last_used = SystemTime::now();
        usage.last_used_at = Instant::now();
        if executed {
            usage.execution_count += 1;
        }
    }

    pub(super) fn expired(&self, now: Instant) -> bool {
        now.duration_since(self.usage().last_used_at) >= self.ttl
    }

    /// Whether a request holds the session (or a run waits for it): it is not to be
    /// expired or evicted now.
    pub(super) fn in_use(&self) -> bool {
        *self.claimed.borrow() || self.state.try_lock().is_err()
    }

    pub fn info(&self) -> SessionInfo {
        let usage = self.usage();
        let status = if *self.claimed.borrow() {
            "busy"
        } else {
            match self.state.try_lock() {
                // A read lists its variables: only a live session's read takes that long.
                Err(_) => "idle",
                Ok(state) if state.dead.is_some() => "dead",
                Ok(state) if state.lost.is_some() => "replay_pending",
                Ok(_) => "idle",
            }
        };
        SessionInfo {
            session_id: self.id.clone(),
            created_at: rfc3339(self.created_at),
            last_used_at: rfc3339(usage.last_used),
            expires_at: rfc3339(usage.last_used + self.ttl),
            execution_count: usage.execution_count,
            status,
            replay: self.replay,
            generation: self.generation(),
        }
    }

    /// The pool generation its worker runs on.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Records the generation of a worker that replaced a lost one.
    pub fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Relaxed);
    }

    pub fn expires_at(&self) -> String {
        rfc3339(self.usage().last_used + self.ttl)
    }

    /// This session's state for a run or a reset: 409 (busy) when another one holds it or
    /// waits for it, 410 when its worker is lost. A read in progress is waited for (it is
    /// bounded by the control timeout), so a run never fails because someone looked.
    pub async fn lock(self: &Arc<Self>) -> Result<Held, SessionError> {
        let claimed = self
            .claimed
            .send_if_modified(|claimed| !std::mem::replace(claimed, true));
        if !claimed {
            return Err(SessionError::Busy(self.id.clone()));
        }
        let claim = Claim(self.clone());
        let state = tokio::select! {
            state = self.state.clone().lock_owned() => state,
            () = self.ended.cancelled() => return Err(self.ended_while_waiting()),
        };
        self.usable(&state)?;
        Ok(Held {
            _claim: Some(claim),
            state,
        })
    }

    /// This session's state for a read: `None` when a run holds it or waits for it (the
    /// worker is busy with that run), 410 when its worker is lost. Another read in
    /// progress is waited for.
    pub async fn read(self: &Arc<Self>) -> Result<Option<Held>, SessionError> {
        let mut claims = self.claimed.subscribe();
        let state = tokio::select! {
            biased;
            _ = claims.wait_for(|claimed| *claimed) => return Ok(None),
            () = self.ended.cancelled() => return Err(self.ended_while_waiting()),
            state = self.state.clone().lock_owned() => state,
        };
        self.usable(&state)?;
        Ok(Some(Held {
            _claim: None,
            state,
        }))
    }

    fn usable(&self, state: &SessionState) -> Result<(), SessionError> {
        match &state.dead {
            Some(reason) => Err(SessionError::Gone {
                id: self.id.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn ended_while_waiting(&self) -> SessionError {
        SessionError::Gone {
            id: self.id.clone(),
            reason: "it ended (deleted, expired or evicted) while this request waited for a \
                     read of it to finish"
                .into(),
        }
    }
}

/// A session's state, held by one request. A run's hold also carries its claim, given up
/// as the state is released.
pub struct Held {
    // Declared first, so dropped first: a run that arrives as this one ends waits the few
    // instructions until the state is free, instead of being refused.
    _claim: Option<Claim>,
    state: OwnedMutexGuard<SessionState>,
}

impl std::ops::Deref for Held {
    type Target = SessionState;

    fn deref(&self) -> &SessionState {
        &self.state
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut SessionState {
        &mut self.state
    }
}

/// A run's claim on a session, given up when it is dropped (also by a request abandoned
/// while it waits).
struct Claim(Arc<Session>);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.claimed.send_replace(false);
    }
}

impl SessionState {
    /// Drops the worker (killing it) and remembers why.
    pub fn mark_dead(&mut self, reason: String) {
        self.worker = None;
        self.dead = Some(reason);
    }

    /// A replay session's worker is lost: it is dropped (killed) and rebuilt before the
    /// next run. Returns `false` (nothing done) for a session without `replay`, or one
    /// whose history grew past its bounds.
    pub fn mark_lost(&mut self, reason: String) -> bool {
        if self.journal.as_ref().is_none_or(|j| j.overflow().is_some()) {
            return false;
        }
        self.worker = None;
        self.lost = Some(reason);
        true
    }

    /// Why the session ends for good when its worker is lost for `reason`: for a replay
    /// session past its bounds, also why it could not be rebuilt.
    pub fn final_reason(&self, reason: String) -> String {
        match self.journal.as_ref().and_then(|j| j.overflow()) {
            Some(why) => format!("{reason}; it could not be replayed: {why}"),
            None => reason,
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
