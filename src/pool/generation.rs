//! Pool generations: one zygote per tier started from one set of settings (environment,
//! configuration, allowlist), with their idle workers. The pool serves new workers from
//! the current generation; a rollover prepares the next one beside it (started, stocked,
//! probed: [`super::probe`]), then switches to it at once. The old one is retired: its
//! idle workers are dropped, workers still running (jobs, sessions) keep it alive through
//! their lease, and its zygotes are shut down once the last lease is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use snakecage_worker::protocol::ZygoteInfo;
use tokio_util::sync::CancellationToken;

use super::tier::Tier;
use super::tiers::TierTable;
use super::zygote::ZygoteHandle;
use super::{PoolError, PoolSettings, keeper};

/// One generation of the pool.
pub(super) struct Generation {
    pub(super) id: u64,
    /// Its tiers, session tier, idle floor and required layers (the pool-wide parts,
    /// size and queue, are the pool's).
    pub(super) settings: PoolSettings,
    pub(super) tiers: Vec<Tier>,
    pub(super) table: TierTable,
    /// Cancelled when it stops being current (or is abandoned, or the pool shuts down).
    pub(super) retired: CancellationToken,
    /// When it started (its first workers come one per tier: see `refill::stock`).
    pub(super) began: Instant,
    /// Held by every worker forked from it: its zygotes live while one is held.
    lease: Arc<()>,
    /// Set once every tier that wanted idle workers has had one ready ([`Generation::stocked`]).
    stocked: AtomicBool,
}

/// What a worker holds of its generation: its id, and a share of the lease that keeps
/// the generation's zygotes running.
#[derive(Debug, Clone)]
pub struct GenerationLease {
    pub id: u64,
    _lease: Arc<()>,
}

impl GenerationLease {
    /// A lease of no generation (for a worker made in a test).
    pub fn unattached(id: u64) -> Self {
        Self {
            id,
            _lease: Arc::new(()),
        }
    }
}

impl Generation {
    /// Starts one zygote per tier of `settings` (waiting until each is ready, with the
    /// required sandbox layers); on any failure, shuts down those that started. With
    /// `background` (a rollover's generation), the zygotes start at idle priority (for
    /// that long at most: see `ZygoteHandle::start`).
    pub(super) async fn start(
        settings: PoolSettings,
        id: u64,
        size: usize,
        background: Option<Duration>,
    ) -> Result<Self, PoolError> {
        assert!(!settings.tiers.is_empty(), "a pool needs at least one tier");
        let started = futures_util::future::join_all(
            settings
                .tiers
                .iter()
                .map(|tier| keeper::start_zygote(&settings, &tier.zygote, 0, background)),
        )
        .await;
        let mut zygotes = Vec::new();
        let mut failure = None;
        for result in started {
            match result {
                Ok(zygote) => zygotes.push(zygote),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            for zygote in zygotes {
                zygote.shutdown(Duration::from_secs(5)).await;
            }
            return Err(e);
        }
        let preloads: Vec<Vec<String>> = settings
            .tiers
            .iter()
            .map(|t| t.zygote.preload.clone())
            .collect();
        let session_tier = settings.session_tier.min(settings.tiers.len() - 1);
        let table = TierTable::new(&preloads, session_tier, settings.min_idle, size);
        let targets = table.targets();
        let tiers = settings
            .tiers
            .iter()
            .cloned()
            .zip(zygotes)
            .zip(targets)
            .map(|((tier, zygote), target)| Tier::new(tier, zygote, target))
            .collect();
        Ok(Self {
            id,
            settings,
            tiers,
            table,
            retired: CancellationToken::new(),
            began: Instant::now(),
            lease: Arc::new(()),
            stocked: AtomicBool::new(false),
        })
    }

    pub(super) fn lease(&self) -> GenerationLease {
        GenerationLease {
            id: self.id,
            _lease: self.lease.clone(),
        }
    }

    /// Whether every tier that wanted idle workers has had one ready: the generation is
    /// stocked, and stays so. A tier that wanted none then (no demand, `tiers.min_idle =
    /// 0`) and is asked for one later is a spawn away, like a tier drained by traffic: it
    /// does not make the generation unready again.
    pub(super) fn stocked(&self) -> bool {
        if self.stocked.load(Ordering::Acquire) {
            return true;
        }
        let now = self
            .tiers
            .iter()
            .all(|t| t.spawned.load(Ordering::Relaxed) > 0 || t.wanted() == 0);
        if now {
            self.stocked.store(true, Ordering::Release);
        }
        now
    }

    /// Whether a worker (idle, running or in a session) still holds its lease.
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.lease) > 1
    }

    /// The session tier's zygote: what `/health` reports of the generation.
    pub(super) fn zygote_info(&self) -> ZygoteInfo {
        let mut info = self.tiers[self.table.session].current_zygote().info.clone();
        if info.packages.is_empty() {
            info.packages = self.tiers[0].current_zygote().info.packages.clone();
        }
        info
    }

    /// Every zygote's info, tier by tier.
    pub(super) fn zygotes(&self) -> Vec<Arc<ZygoteHandle>> {
        self.tiers.iter().map(Tier::current_zygote).collect()
    }

    /// Drops its idle workers (killing them) and marks it retired.
    pub(super) fn retire(&self) {
        self.retired.cancel();
        for tier in &self.tiers {
            drop(tier.idle.drain());
        }
    }

    /// Shuts its zygotes down (they kill and reap whatever workers are left).
    pub(super) async fn shut_down(&self) {
        let zygotes = self.zygotes();
        futures_util::future::join_all(
            zygotes
                .iter()
                .map(|zygote| zygote.shutdown(Duration::from_secs(5))),
        )
        .await;
    }
}

/// The pool's generations: the current one, the one being prepared, the retired ones
/// still in use.
pub(super) struct Generations {
    current: RwLock<Arc<Generation>>,
    warming: Mutex<Option<Arc<Generation>>>,
    retired: Mutex<Vec<Arc<Generation>>>,
}

/// A retired generation, as `/health` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct RetiredGeneration {
    pub id: u64,
    /// Workers (running jobs, sessions) still on it.
    pub in_use: usize,
}

impl Generations {
    pub(super) fn new(first: Generation) -> Self {
        Self {
            current: RwLock::new(Arc::new(first)),
            warming: Mutex::new(None),
            retired: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn current(&self) -> Arc<Generation> {
        self.current.read().expect("generation lock").clone()
    }

    /// The id the next prepared generation gets: one more than the current one's. Ids
    /// count the generations that served: one that fails (or is dropped unswitched) leaves
    /// no gap, and the next attempt is made under the same id. Nothing outlives a failed
    /// attempt under its id (its zygotes are shut down, nothing is keyed by it), and one
    /// generation is prepared at a time (the rollover slot).
    pub(super) fn next_id(&self) -> u64 {
        self.current().id + 1
    }

    /// Whether `generation` is the one serving (by identity: a failed attempt may have
    /// carried the same id).
    pub(super) fn is_current(&self, generation: &Arc<Generation>) -> bool {
        Arc::ptr_eq(&self.current(), generation)
    }

    /// The generations the refill keeps stocked: the current one and the one warming up.
    pub(super) fn stocked(&self) -> Vec<Arc<Generation>> {
        let mut out = vec![self.current()];
        if let Some(warming) = self.warming.lock().expect("warming lock").clone() {
            out.push(warming);
        }
        out
    }

    pub(super) fn set_warming(&self, generation: Option<Arc<Generation>>) {
        *self.warming.lock().expect("warming lock") = generation;
    }

    /// Makes `next` current; returns the generation it replaced, now retired.
    pub(super) fn switch(&self, next: Arc<Generation>) -> Arc<Generation> {
        let old = std::mem::replace(&mut *self.current.write().expect("generation lock"), next);
        self.set_warming(None);
        old.retire();
        self.retired.lock().expect("retired lock").push(old.clone());
        old
    }

    /// The retired generations some worker still uses.
    pub(super) fn retired(&self) -> Vec<RetiredGeneration> {
        self.retired
            .lock()
            .expect("retired lock")
            .iter()
            .map(|g| RetiredGeneration {
                id: g.id,
                in_use: Arc::strong_count(&g.lease).saturating_sub(1),
            })
            .collect()
    }

    /// Every generation whose zygotes may be running (for shutdown).
    pub(super) fn all(&self) -> Vec<Arc<Generation>> {
        let mut out = self.stocked();
        out.extend(self.retired.lock().expect("retired lock").iter().cloned());
        out
    }

    /// Shuts down the retired generations nothing uses any more; returns their ids.
    pub(super) async fn collect_garbage(&self) -> Vec<u64> {
        let unused: Vec<Arc<Generation>> = {
            let mut retired = self.retired.lock().expect("retired lock");
            let (unused, kept) = retired.drain(..).partition(|g| !g.in_use());
            *retired = kept;
            unused
        };
        for generation in &unused {
            generation.shut_down().await;
            tracing::info!(
                generation = generation.id,
                "an old generation's zygotes were shut down: nothing uses them any more"
            );
        }
        unused.iter().map(|g| g.id).collect()
    }
}
