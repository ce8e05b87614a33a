//! Stateful Python sessions: the registry (create, look up, delete, list), idle expiry,
//! eviction at `max_sessions` (the least recently used idle session of the tenant that holds
//! the most), and one request at a time per session.
//!
//! A session owns one worker (taken from the pool, forked and hardened like any other, then
//! switched to session mode) and that worker's workspace. It holds no execution slot while
//! idle; each run takes one (see `pool` for how sessions share the slots).
//!
//! Choices:
//! - `ttl_seconds` is an *idle* time-to-live: `expires_at = last_used_at + ttl` and every use
//!   pushes it back. Without it, `sessions.idle_timeout_seconds` applies.
//! - A second request on a session that is running one gets 409 at once rather than
//!   queueing behind a run that may take up to its whole timeout.
//! - A session that expired, was evicted, or whose worker was lost is remembered (a bounded
//!   list of tombstones), so a call on it gets 410 Gone saying why — never a silent fresh
//!   namespace. An explicitly deleted session is simply unknown (404).
//! - A session created with `replay` keeps a journal instead (see [`replay`]): a lost
//!   worker is rebuilt before the next run, and the caller is told.

pub mod replay;
pub mod replay_calls;
mod session;

use self::session::Usage;
pub use self::session::{Held, Session, SessionIndicator, SessionInfo, SessionState};

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::metrics::labels::SessionEnd;

use self::replay::{Journal, ReplayLimits};
use crate::files::workspace::Staged;
use crate::pool::{Pool, PoolError};

/// Tombstones kept for sessions that ended without being deleted.
const MAX_TOMBSTONES: usize = 4096;
/// How often idle sessions are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub idle_timeout: Duration,
    pub max_sessions: usize,
    pub max_ttl: Duration,
    pub interrupt_grace: Duration,
    /// Bounds of a replay session's journal.
    pub replay: ReplayLimits,
    /// Written between `sess_` and the random part of every new session id: in a cluster,
    /// the replica that owns it and its incarnation, for a single replica its incarnation
    /// (see `crate::cluster`).
    pub id_prefix: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("Session '{0}' not found")]
    NotFound(String),
    #[error("Session '{id}' is gone: {reason}. Its state is lost; create a new session.")]
    Gone { id: String, reason: String },
    #[error(
        "Session '{0}' is busy with another request; a session runs one request at a time, retry when it has finished"
    )]
    Busy(String),
    #[error(
        "all {0} sessions are busy running code, so none can be evicted for a new one; retry later or delete a session"
    )]
    Full(usize),
    #[error(
        "API key '{owner}' already holds {max} sessions, its max_sessions limit; delete one and retry"
    )]
    TenantLimit { owner: String, max: usize },
    #[error(transparent)]
    Pool(#[from] PoolError),
}

#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    settings: SessionSettings,
    table: Mutex<Table>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Table {
    live: HashMap<String, Arc<Session>>,
    /// Sessions being created: they count against `max_sessions` already.
    creating: usize,
    /// The same, per owner (for the owners' `max_sessions`).
    creating_by: HashMap<String, usize>,
    /// Sessions that ended on their own: id, owner, why.
    tombstones: VecDeque<Tombstone>,
}

struct Tombstone {
    id: String,
    owner: Option<String>,
    reason: String,
}

impl Table {
    fn bury(&mut self, id: String, owner: Option<String>, reason: String) {
        if self.tombstones.len() >= MAX_TOMBSTONES {
            self.tombstones.pop_front();
        }
        self.tombstones.push_back(Tombstone { id, owner, reason });
    }

    /// Removes `id` as ended for `reason` (killing a run in progress).
    fn end(&mut self, id: &str, reason: String) -> Option<Arc<Session>> {
        let session = self.live.remove(id)?;
        session.ended.cancel();
        self.bury(id.to_owned(), session.owner.clone(), reason);
        Some(session)
    }
}

/// Undoes a reservation when a creation fails or is abandoned.
struct Creating<'a>(&'a Inner, Option<&'a str>, bool);

impl Creating<'_> {
    fn release(&mut self, table: &mut Table) {
        if std::mem::take(&mut self.2) {
            table.creating -= 1;
            if let Some(n) = self.1.and_then(|o| table.creating_by.get_mut(o)) {
                *n -= 1;
            }
        }
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        if self.2 {
            let inner = self.0;
            self.release(&mut inner.table.lock().expect("sessions lock"));
        }
    }
}

impl Sessions {
    /// The registry and its expiry sweeper, which stops with `stop`.
    pub fn new(
        pool: Pool,
        settings: SessionSettings,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Self {
        let inner = Arc::new(Inner {
            pool,
            settings,
            table: Mutex::new(Table::default()),
            metrics,
        });
        tokio::spawn(sweeper(Arc::downgrade(&inner), stop));
        Self { inner }
    }

    pub fn settings(&self) -> &SessionSettings {
        &self.inner.settings
    }

    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// A new session with its own worker; `stage` fills its workspace before it is
    /// registered. At `max_sessions`, an idle session is evicted (of the tenant holding the
    /// most, its least recently used); an
    /// `owner` at its own `owner_max` is refused (`TenantLimit`). With `replay`, the
    /// session keeps a journal that starts with the files `stage` placed.
    pub async fn create<E: From<SessionError>>(
        &self,
        owner: Option<&str>,
        owner_max: Option<usize>,
        ttl: Option<Duration>,
        replay: Option<&[crate::files::workspace::StageInput]>,
        stage: impl AsyncFnOnce(&std::path::Path) -> Result<Staged, E>,
    ) -> Result<Arc<Session>, E> {
        let inner = &self.inner;
        let evicted = self.reserve(owner, owner_max)?;
        drop(evicted); // killed outside the lock
        let mut creating = Creating(inner, owner, true);
        let worker = inner
            .pool
            .start_session_worker()
            .await
            .map_err(SessionError::from)?;
        let baseline = stage(worker.workspace_path()).await?;
        let journal = replay.map(|inputs| {
            let mut journal = Journal::new(inner.settings.replay);
            journal.stage(inputs);
            journal
        });
        let now = SystemTime::now();
        let session = Arc::new(Session {
            id: format!(
                "sess_{}{}",
                inner.settings.id_prefix,
                uuid::Uuid::new_v4().simple()
            ),
            owner: owner.map(str::to_owned),
            created_at: now,
            replay: journal.is_some(),
            ttl: ttl.unwrap_or(inner.settings.idle_timeout),
            usage: Mutex::new(Usage {
                last_used: now,
                last_used_at: Instant::now(),
                execution_count: 0,
            }),
            generation: std::sync::atomic::AtomicU64::new(worker.generation()),
            state: Arc::new(tokio::sync::Mutex::new(SessionState {
                worker: Some(worker),
                dead: None,
                lost: None,
                journal,
                baseline,
            })),
            claimed: tokio::sync::watch::Sender::new(false),
            ended: CancellationToken::new(),
        });
        let mut table = inner.table.lock().expect("sessions lock");
        creating.release(&mut table);
        table.live.insert(session.id.clone(), session.clone());
        inner.metrics.session_created();
        tracing::info!(session = %session.id, "session created");
        Ok(session)
    }

    /// Counts a session being created, evicting the least recently used idle one when
    /// the table is full. Returns the evicted sessions, to be dropped outside the lock.
    fn reserve(
        &self,
        owner: Option<&str>,
        owner_max: Option<usize>,
    ) -> Result<Vec<Arc<Session>>, SessionError> {
        let max = self.inner.settings.max_sessions;
        let mut table = self.inner.table.lock().expect("sessions lock");
        if let (Some(owner), Some(owner_max)) = (owner, owner_max) {
            let held = table
                .live
                .values()
                .filter(|s| s.owner.as_deref() == Some(owner))
                .count()
                + table.creating_by.get(owner).copied().unwrap_or(0);
            if held >= owner_max {
                return Err(SessionError::TenantLimit {
                    owner: owner.to_owned(),
                    max: owner_max,
                });
            }
        }
        let mut evicted = Vec::new();
        while table.live.len() + table.creating >= max {
            // The tenant that holds the most sessions gives one up, its least recently
            // used idle one: a tenant creating sessions past the table's size evicts its
            // own before anyone else's, and one with a single session keeps it. Among
            // tenants holding as many, the one creating gives up its own: a new session
            // never costs another tenant its share.
            let mut held: HashMap<Option<&str>, usize> = HashMap::new();
            for session in table.live.values() {
                *held.entry(session.owner.as_deref()).or_default() += 1;
            }
            let victim = table
                .live
                .values()
                .filter(|s| !s.in_use())
                .min_by_key(|s| {
                    (
                        std::cmp::Reverse(held[&s.owner.as_deref()]),
                        s.owner.as_deref() != owner,
                        s.usage().last_used_at,
                    )
                })
                .map(|s| s.id.clone());
            let Some(id) = victim else {
                return Err(SessionError::Full(max));
            };
            let reason = format!(
                "it was evicted as the least recently used session when the limit of {max} sessions was reached"
            );
            tracing::info!(session = %id, "session evicted (least recently used)");
            let ended = table.end(&id, reason);
            self.counted(&ended, SessionEnd::Evicted);
            evicted.extend(ended);
        }
        table.creating += 1;
        if let Some(owner) = owner {
            *table.creating_by.entry(owner.to_owned()).or_default() += 1;
        }
        Ok(evicted)
    }

    /// The live session `id` of `owner`; 410 when it ended without being deleted, else
    /// 404. Another owner's session is `NotFound`, live or ended, as if it never existed.
    pub fn get(&self, id: &str, owner: Option<&str>) -> Result<Arc<Session>, SessionError> {
        let mut table = self.inner.table.lock().expect("sessions lock");
        let live = table
            .live
            .get(id)
            .filter(|s| s.owner.as_deref() == owner)
            .cloned();
        if let Some(session) = live {
            if session.expired(Instant::now()) && !session.in_use() {
                let ended = table.end(id, self.expiry_reason(&session));
                self.counted(&ended, SessionEnd::Expired);
            } else {
                return Ok(session);
            }
        }
        let tombstone = table
            .tombstones
            .iter()
            .rev()
            .find(|t| t.id == id && t.owner.as_deref() == owner);
        match tombstone {
            Some(t) => Err(SessionError::Gone {
                id: id.to_owned(),
                reason: t.reason.clone(),
            }),
            None => Err(SessionError::NotFound(id.to_owned())),
        }
    }

    /// Deletes `id`: kills its worker (even mid-run) and removes its workspace.
    pub fn delete(&self, id: &str, owner: Option<&str>) -> Result<(), SessionError> {
        let mut table = self.inner.table.lock().expect("sessions lock");
        let owned = table
            .live
            .get(id)
            .is_some_and(|s| s.owner.as_deref() == owner);
        let Some(session) = owned.then(|| table.live.remove(id)).flatten() else {
            // A session that ended on its own (lost, expired, evicted) can still be deleted:
            // that forgets why it ended, so later calls get 404 instead of 410.
            let before = table.tombstones.len();
            table
                .tombstones
                .retain(|t| t.id != id || t.owner.as_deref() != owner);
            if table.tombstones.len() < before {
                return Ok(());
            }
            return Err(SessionError::NotFound(id.to_owned()));
        };
        session.ended.cancel();
        self.inner.metrics.session_ended(SessionEnd::Closed);
        tracing::info!(session = %id, "session deleted");
        Ok(())
    }

    /// Ends `id` because its worker died or had to be killed: its state is gone, and every
    /// later call on it gets 410 with `reason`.
    pub fn lose(&self, id: &str, reason: String) {
        let ended = self
            .inner
            .table
            .lock()
            .expect("sessions lock")
            .end(id, reason);
        self.counted(&ended, SessionEnd::Lost);
    }

    /// Counts a session that `Table::end` really ended (it may have ended already).
    fn counted(&self, ended: &Option<Arc<Session>>, why: SessionEnd) {
        if ended.is_some() {
            self.inner.metrics.session_ended(why);
        }
    }

    /// The live sessions of `owner`.
    pub fn list(&self, owner: Option<&str>) -> Vec<SessionInfo> {
        let table = self.inner.table.lock().expect("sessions lock");
        let mut out: Vec<SessionInfo> = table
            .live
            .values()
            .filter(|s| s.owner.as_deref() == owner)
            .map(|s| s.info())
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        out
    }

    /// How many live sessions run on each zygote generation.
    pub fn by_generation(&self) -> std::collections::BTreeMap<u64, usize> {
        let table = self.inner.table.lock().expect("sessions lock");
        let mut out = std::collections::BTreeMap::new();
        for session in table.live.values() {
            *out.entry(session.generation()).or_default() += 1;
        }
        out
    }

    pub fn count(&self) -> usize {
        self.inner.table.lock().expect("sessions lock").live.len()
    }

    fn expiry_reason(&self, session: &Session) -> String {
        format!(
            "it expired after {} s without use",
            session.ttl.as_secs_f64().round() as u64
        )
    }
}

/// Ends sessions idle past their TTL; a session running a request is never expired.
async fn sweeper(inner: std::sync::Weak<Inner>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
            () = stop.cancelled() => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        let sessions = Sessions { inner };
        let now = Instant::now();
        let ended: Vec<Arc<Session>> = {
            let mut table = sessions.inner.table.lock().expect("sessions lock");
            let expired: Vec<(String, String)> = table
                .live
                .values()
                .filter(|s| s.expired(now) && !s.in_use())
                .map(|s| (s.id.clone(), sessions.expiry_reason(s)))
                .collect();
            expired
                .into_iter()
                .filter_map(|(id, reason)| {
                    tracing::info!(session = %id, "session expired");
                    let ended = table.end(&id, reason);
                    sessions.counted(&ended, SessionEnd::Expired);
                    ended
                })
                .collect()
        };
        drop(ended);
    }
}
