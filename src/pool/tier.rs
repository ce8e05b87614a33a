//! One tier of the pool: a zygote with its preload profile, its idle workers, the workers
//! being spawned for it, and the number of idle workers it should keep ready now.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use snakecage_worker::protocol::ZygoteConfig;

use super::idle::IdleSet;
use super::status::{TierStatus, ZygoteStatus};
use super::zygote::ZygoteHandle;

/// What configures one tier.
#[derive(Debug, Clone)]
pub struct TierSettings {
    /// Its name in metrics, `/health` and the logs.
    pub name: String,
    /// Its zygote: preloads, warm-up, limits and sandbox.
    pub zygote: ZygoteConfig,
}

pub(super) struct Tier {
    pub(super) name: String,
    pub(super) zygote_config: ZygoteConfig,
    zygote: RwLock<Arc<ZygoteHandle>>,
    pub(super) idle: IdleSet,
    pub(super) spawning: AtomicUsize,
    /// Idle workers this tier keeps ready now.
    pub(super) target: AtomicUsize,
    /// Jobs routed here that are waiting for an idle worker.
    waiters: AtomicUsize,
    /// Workers taken from this tier (jobs and sessions).
    pub(super) checkouts: AtomicU64,
    /// Workers this tier has started (and that said Ready).
    pub(super) spawned: AtomicU64,
    /// Of those, the ones started without the warm-up (see [`Tier::warm_up_next`]).
    pub(super) spawned_cold: AtomicU64,
}

impl Tier {
    pub(super) fn new(settings: TierSettings, zygote: Arc<ZygoteHandle>, target: usize) -> Self {
        Self {
            name: settings.name,
            zygote_config: settings.zygote,
            zygote: RwLock::new(zygote),
            idle: IdleSet::default(),
            spawning: AtomicUsize::new(0),
            target: AtomicUsize::new(target),
            waiters: AtomicUsize::new(0),
            checkouts: AtomicU64::new(0),
            spawned: AtomicU64::new(0),
            spawned_cold: AtomicU64::new(0),
        }
    }

    pub(super) fn current_zygote(&self) -> Arc<ZygoteHandle> {
        self.zygote.read().expect("zygote lock").clone()
    }

    pub(super) fn replace_zygote(&self, zygote: Arc<ZygoteHandle>) {
        *self.zygote.write().expect("zygote lock") = zygote;
    }

    /// Idle workers plus those on their way.
    pub(super) fn stocked(&self) -> usize {
        self.idle.len() + self.spawning.load(Ordering::Acquire)
    }

    /// How many idle workers to keep now: the target, or more while more jobs wait.
    pub(super) fn wanted(&self) -> usize {
        self.target
            .load(Ordering::Acquire)
            .max(self.waiters.load(Ordering::Acquire))
    }

    /// Whether the worker asked for now should run the tier's warm-up jobs: only when no
    /// job routed here is waiting for a worker. One that is would wait for the warm-up's
    /// first-use costs and then pay its own run on top: under saturation every request
    /// waits for a spawn, and a warm-up would only double the work (at concurrency 4 the
    /// numpy/pandas snippet served 254/s without warm-ups against 189-194/s with them).
    /// When the pool keeps up, workers are made before they are needed, and warmed.
    pub(super) fn warm_up_next(&self) -> bool {
        self.waiters.load(Ordering::Acquire) == 0
    }

    /// Counts a job waiting for this tier until the guard is dropped.
    pub(super) fn want(&self) -> WantGuard<'_> {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        WantGuard(&self.waiters)
    }

    pub(super) fn status(&self) -> TierStatus {
        let zygote = self.current_zygote();
        TierStatus {
            name: self.name.clone(),
            preload: self.zygote_config.preload.clone(),
            idle: self.idle.len(),
            spawning: self.spawning.load(Ordering::Relaxed),
            target_idle: self.wanted(),
            checkouts: self.checkouts.load(Ordering::Relaxed),
            workers_spawned: self.spawned.load(Ordering::Relaxed),
            workers_spawned_cold: self.spawned_cold.load(Ordering::Relaxed),
            zygote: Some(ZygoteStatus {
                pid: zygote.info.pid,
                generation: zygote.generation,
                alive: zygote.is_alive(),
                python_version: zygote.info.python_version.clone(),
            }),
        }
    }
}

pub(super) struct WantGuard<'a>(&'a AtomicUsize);

impl Drop for WantGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
