//! One tier of the pool: a zygote with its preload profile, its idle workers, the workers
//! being spawned for it, and the number of idle workers it should keep ready now.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use snakecage_worker::protocol::ZygoteConfig;

use super::idle::IdleSet;
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
}
