//! What the pool tells `/health`, the status page and the metrics about itself: counters
//! kept as it works, and a snapshot of its state.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Counters kept by the pool; `/health` and the metrics read them.
#[derive(Debug, Default)]
pub struct PoolCounters {
    pub workers_spawned: AtomicU64,
    pub spawn_failures: AtomicU64,
    pub zygote_restarts: AtomicU64,
    pub workers_lost: AtomicU64,
    /// Spawn failures since the last worker that started; 0 when spawning works.
    pub consecutive_spawn_failures: AtomicU64,
    /// Why the last spawn failed, and since when spawning has failed without a success,
    /// until a worker starts again.
    pub last_spawn_error: Mutex<Option<(String, Instant)>>,
}

/// The pool says it cannot start workers (`/ready` is 503, requests waiting for a worker
/// get 503 at once) after this many spawn failures in a row with the zygote alive, and no
/// success for [`FAILING_FOR`]: a worker killed while it started, or a workspace removed
/// once, is not an outage.
const FAILING_AFTER: u64 = 2;
const FAILING_FOR: Duration = Duration::from_secs(1);

impl PoolCounters {
    /// Records a failed attempt to start a worker (or a zygote).
    pub(super) fn spawn_failed(&self, error: String) {
        let mut last = self.last_spawn_error.lock().expect("spawn error lock");
        let since = last.as_ref().map_or_else(Instant::now, |(_, since)| *since);
        *last = Some((error, since));
        self.consecutive_spawn_failures
            .fetch_add(1, Ordering::AcqRel);
    }

    /// A worker (or a zygote) started: whatever failed before is over.
    pub(super) fn spawn_succeeded(&self) {
        let failures = self.consecutive_spawn_failures.swap(0, Ordering::AcqRel);
        if failures >= FAILING_AFTER {
            tracing::info!(failures, "workers start again");
        }
        *self.last_spawn_error.lock().expect("spawn error lock") = None;
    }

    /// The last spawn error, once spawning has failed [`FAILING_AFTER`] times in a row for
    /// at least [`FAILING_FOR`].
    pub(super) fn spawn_trouble(&self) -> Option<String> {
        if self.consecutive_spawn_failures.load(Ordering::Acquire) < FAILING_AFTER {
            return None;
        }
        match &*self.last_spawn_error.lock().expect("spawn error lock") {
            Some((error, since)) if since.elapsed() >= FAILING_FOR => Some(error.clone()),
            _ => None,
        }
    }
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
    /// Why workers cannot be started, while they cannot.
    pub last_spawn_error: Option<String>,
    /// Each tier of the current generation, lightest first. `idle` and `spawning` above
    /// are their sums; `zygote` above is the session tier's, alive only while every
    /// tier's zygote is.
    pub tiers: Vec<TierStatus>,
    /// The generation new workers come from.
    pub generation: u64,
    /// Whether every tier of it that wanted idle workers has had one ready (latched:
    /// `/ready` answers from it).
    #[serde(skip)]
    pub stocked: bool,
    /// Older generations still running jobs or sessions (shut down when they end).
    pub retired_generations: Vec<super::RetiredGeneration>,
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
    /// Workers it has started so far (`/ready` waits for one in every tier).
    pub workers_spawned: u64,
    /// Of those, the ones started without the tier's warm-up: because a job was already
    /// waiting for a worker (the pool was not keeping up), or the tier's first.
    pub workers_spawned_cold: u64,
    /// Idle workers started cold that were replaced by warmed ones once no job waited.
    pub cold_workers_replaced: u64,
    pub zygote: Option<ZygoteStatus>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ZygoteStatus {
    pub pid: i32,
    /// How many times the tier's zygote was restarted (it died) before this one, within
    /// the zygote generation serving. Not a generation: that is `/health`'s `generation.id`.
    pub restarts: u64,
    pub alive: bool,
    pub python_version: String,
}
