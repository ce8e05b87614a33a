//! What the pool tells `/health`, the status page and the metrics about itself: counters
//! kept as it works, and a snapshot of its state.

use std::sync::atomic::AtomicU64;

use serde::Serialize;

/// Counters kept by the pool; `/health` and the metrics read them.
#[derive(Debug, Default)]
pub struct PoolCounters {
    pub workers_spawned: AtomicU64,
    pub spawn_failures: AtomicU64,
    pub zygote_restarts: AtomicU64,
    pub workers_lost: AtomicU64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolStatus {
    pub target_size: usize,
    pub idle: usize,
    pub busy: usize,
    pub spawning: usize,
    pub queue_depth: usize,
    pub queue_length: usize,
    pub zygote: Option<ZygoteStatus>,
    pub workers_spawned: u64,
    pub spawn_failures: u64,
    pub zygote_restarts: u64,
    /// Each tier, lightest first. `idle` and `spawning` above are their sums; `zygote`
    /// above is the session tier's, alive only while every tier's zygote is.
    pub tiers: Vec<TierStatus>,
}

/// One tier of the pool.
#[derive(Debug, Clone, Serialize)]
pub struct TierStatus {
    pub name: String,
    /// The modules its zygote was configured to preload.
    pub preload: Vec<String>,
    pub idle: usize,
    pub spawning: usize,
    /// Idle workers it keeps ready now (follows the recent demand).
    pub target_idle: usize,
    /// Workers taken from it so far, for jobs and sessions.
    pub checkouts: u64,
    pub zygote: Option<ZygoteStatus>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ZygoteStatus {
    pub pid: i32,
    pub generation: u64,
    pub alive: bool,
    pub python_version: String,
}
