//! Pool generations: one zygote per tier started from one set of settings (environment,
//! configuration, allowlist), with their idle workers. The pool serves new workers from
//! the current generation; a rollover prepares the next one beside it (started, stocked,
//! probed: [`super::probe`]), then switches to it at once. The old one is retired: its
//! idle workers are dropped, workers still running (jobs, sessions) keep it alive through
//! their lease, and its zygotes are shut down once the last lease is gone.
//!
//! The service's first generation starts serving before its fuller tiers are up
//! ([`Generation::starting`]); a rollover's is complete before it serves.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use snakecage_worker::protocol::{Layer, ZygoteInfo};
use tokio_util::sync::CancellationToken;

use super::cpu_budget::{Enforcement, Terms};
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
    /// Starts one zygote per tier of `settings` for a rollover (waiting until each is
    /// ready, with the required sandbox layers); on any failure, shuts down those that
    /// started. They start at idle priority, for `background` at most (see
    /// `ZygoteHandle::start`).
    pub(super) async fn start(
        settings: PoolSettings,
        id: u64,
        size: usize,
        background: Duration,
    ) -> Result<Self, PoolError> {
        assert!(!settings.tiers.is_empty(), "a pool needs at least one tier");
        let started = futures_util::future::join_all(
            settings
                .tiers
                .iter()
                .map(|tier| keeper::start_zygote(&settings, &tier.zygote, 0, Some(background))),
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
        Ok(Self::new(
            settings,
            id,
            size,
            zygotes.into_iter().map(Some).collect(),
        ))
    }

    /// A generation of `settings` whose zygotes have not started yet: each is put in place
    /// as it comes up (`keeper::keep_zygotes` starts them), and its tier serves from its
    /// first worker on.
    pub(super) fn starting(settings: PoolSettings, id: u64, size: usize) -> Self {
        assert!(!settings.tiers.is_empty(), "a pool needs at least one tier");
        let none = vec![None; settings.tiers.len()];
        Self::new(settings, id, size, none)
    }

    fn new(
        settings: PoolSettings,
        id: u64,
        size: usize,
        zygotes: Vec<Option<Arc<ZygoteHandle>>>,
    ) -> Self {
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
        Self {
            id,
            settings,
            tiers,
            table,
            retired: CancellationToken::new(),
            began: Instant::now(),
            lease: Arc::new(()),
        }
    }

    /// The tier that serves a job routed to `routed` now: that tier once it serves, else
    /// the lightest fuller one that does, else the fullest that does (any code runs on
    /// any tier). Before any serves (the service's first worker is on its way): `routed`
    /// if its zygote is up, else the lightest tier, whose zygote a started pool has.
    pub(super) fn serving_tier(&self, routed: usize) -> usize {
        let serves = |i: &usize| self.tiers[*i].serves();
        if let Some(&tier) = self.table.candidates(routed).iter().find(|i| serves(i)) {
            return tier;
        }
        if let Some(tier) = (0..self.tiers.len()).rev().find(serves) {
            return tier;
        }
        if self.tiers[routed].zygote().is_some() {
            routed
        } else {
            0
        }
    }

    pub(super) fn lease(&self) -> GenerationLease {
        GenerationLease {
            id: self.id,
            _lease: self.lease.clone(),
        }
    }

    /// Whether a worker (idle, running or in a session) still holds its lease.
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.lease) > 1
    }

    /// The zygote of the tier serving sessions now: what `/health` reports of the
    /// generation.
    pub(super) fn zygote_info(&self) -> ZygoteInfo {
        let lightest = || {
            self.tiers[0]
                .zygote()
                .expect("a started generation's lightest tier has its zygote")
        };
        let session = self.tiers[self.serving_tier(self.table.session)].zygote();
        let mut info = session.unwrap_or_else(lightest).info.clone();
        if info.packages.is_empty() {
            info.packages = lightest().info.packages.clone();
        }
        info
    }

    /// The CPU-time budgets a session's worker of this generation gets, as its workers
    /// were told them (each tier's workers start with the same limits).
    pub(super) fn session_cpu_budget(&self) -> Terms {
        let config = &self.tiers[self.table.session].zygote_config;
        let limits = &config.limits;
        let enforcement = if !config.sandbox.wants(Layer::Rlimits) {
            Enforcement::Off
        } else if limits.cpu_life_seconds.is_some() {
            Enforcement::Watchdog
        } else {
            Enforcement::Kernel
        };
        Terms {
            enforcement,
            seconds: limits.cpu_seconds,
            life_seconds: limits.cpu_life_seconds,
        }
    }

    /// The zygotes that have started, tier by tier.
    pub(super) fn zygotes(&self) -> Vec<Arc<ZygoteHandle>> {
        self.tiers.iter().filter_map(Tier::zygote).collect()
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
    pub(super) fn new(first: Arc<Generation>) -> Self {
        Self {
            current: RwLock::new(first),
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
