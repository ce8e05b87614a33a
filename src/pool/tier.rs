//! One tier of the pool: a zygote with its preload profile, its idle workers, the workers
//! being spawned for it, and the number of idle workers it should keep ready now. At the
//! service's start a tier may have no zygote yet (it is preloading, or its start failed
//! and is retried): the service serves from the tiers that are up meanwhile
//! ([`Tier::serves`]).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use nix::sys::socket::MsgFlags;
use snakecage_worker::frame;
use snakecage_worker::protocol::{JobRequest, ZygoteConfig};
use tokio::sync::Notify;

use super::idle::IdleSet;
use super::status::{TierState, TierStatus, ZygoteStatus};
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
    /// None until its zygote first started.
    zygote: RwLock<Option<Arc<ZygoteHandle>>>,
    /// Why its zygote's last attempt to start failed, while it has never started.
    start_failure: Mutex<Option<String>>,
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
    /// Idle workers started cold, then replaced by warmed ones.
    pub(super) cold_replaced: AtomicU64,
    /// Workers forked to run the warm-up and not Ready yet, oldest first: a job that starts
    /// waiting asks one to skip it ([`Tier::skip_a_warm_up`]).
    warming: Mutex<Vec<Warming>>,
    /// Fired when jobs start waiting: workers on their way are raised ([`Tier::in_demand`]).
    demand: Notify,
    /// The zygote raised to normal priority while jobs wait ([`Tier::prioritise`]).
    raised: Mutex<Option<Arc<ZygoteHandle>>>,
}

/// A worker on its way that may still skip its warm-up: its id, and our end of its job
/// socket (a duplicate; the spawn keeps the original).
struct Warming {
    id: u64,
    sock: OwnedFd,
}

impl Tier {
    /// A tier of `settings` with `zygote`, or with none yet (it is started later:
    /// `keeper::keep_zygotes`).
    pub(super) fn new(
        settings: TierSettings,
        zygote: Option<Arc<ZygoteHandle>>,
        target: usize,
    ) -> Self {
        Self {
            name: settings.name,
            zygote_config: settings.zygote,
            zygote: RwLock::new(zygote),
            start_failure: Mutex::new(None),
            idle: IdleSet::default(),
            spawning: AtomicUsize::new(0),
            target: AtomicUsize::new(target),
            waiters: AtomicUsize::new(0),
            checkouts: AtomicU64::new(0),
            spawned: AtomicU64::new(0),
            spawned_cold: AtomicU64::new(0),
            cold_replaced: AtomicU64::new(0),
            warming: Mutex::new(Vec::new()),
            demand: Notify::new(),
            raised: Mutex::new(None),
        }
    }

    /// Its zygote, once it has started.
    pub(super) fn zygote(&self) -> Option<Arc<ZygoteHandle>> {
        self.zygote.read().expect("zygote lock").clone()
    }

    /// Puts `zygote` in place: the tier's first, or one replacing a dead one.
    pub(super) fn replace_zygote(&self, zygote: Arc<ZygoteHandle>) {
        *self.zygote.write().expect("zygote lock") = Some(zygote);
        *self.start_failure.lock().expect("start failure lock") = None;
        // Jobs may have waited through the restart.
        self.prioritise();
    }

    /// Records why its zygote could not start, while it has none that runs (it never
    /// started, or died and cannot be restarted).
    pub(super) fn start_failed(&self, why: String) {
        *self.start_failure.lock().expect("start failure lock") = Some(why);
    }

    /// Whether jobs routed here are served here: its zygote is up and has had a worker
    /// ready. Until then, and while a zygote that died is restarted, they go to a tier
    /// that serves (any code runs on any tier), so none waits for a zygote that is still
    /// preloading, nor for its first worker. A tier that keeps no idle worker (its target
    /// is 0) makes one only for a job that waits for it: it serves once its zygote is up.
    pub(super) fn serves(&self) -> bool {
        self.zygote().is_some_and(|z| z.is_alive())
            && (self.spawned.load(Ordering::Acquire) > 0
                || self.target.load(Ordering::Acquire) == 0)
    }

    /// Where it stands: starting, serving, or failed to start.
    pub(super) fn state(&self) -> TierState {
        if self.serves() {
            TierState::Serving
        } else if (self.start_failure.lock())
            .expect("start failure lock")
            .is_some()
        {
            // Set only while it has no zygote that runs (`replace_zygote` clears it).
            TierState::Failed
        } else {
            TierState::Starting
        }
    }

    /// Whether jobs routed here wait for a worker: then the workers on their way are what
    /// they wait for, not background work.
    pub(super) fn in_demand(&self) -> bool {
        self.waiters.load(Ordering::Acquire) > 0
    }

    /// Resolves when jobs start waiting (create it before checking [`Tier::in_demand`]).
    pub(super) fn demand(&self) -> tokio::sync::futures::Notified<'_> {
        self.demand.notified()
    }

    /// Runs the zygote at the priority its demand calls for. Its forks are background work
    /// (`SCHED_IDLE`: they yield to every request in flight) until a job waits for one:
    /// then it runs at normal priority, or any busy process on the host (a build, another
    /// service) would hold back the very workers the jobs wait for (a c=4 load beside a
    /// compiler: 20–25 requests/s with the zygote idle, 160/s raised). Back to `SCHED_IDLE`
    /// once none waits. Needs CAP_SYS_NICE; without it the zygote runs at nice 10 anyway.
    fn prioritise(&self) {
        let mut raised = self.raised.lock().expect("raised lock");
        if self.in_demand() {
            let Some(zygote) = self.zygote() else {
                return;
            };
            if raised.as_ref().is_some_and(|r| Arc::ptr_eq(r, &zygote)) {
                return;
            }
            // A zygote the supervisor has not reaped keeps its pid: alive, it is ours.
            if zygote.is_alive() && super::worker::raise_priority(zygote.info.pid) {
                *raised = Some(zygote);
            }
        } else if let Some(zygote) = raised.take()
            && zygote.is_alive()
        {
            super::worker::lower_priority(zygote.info.pid);
        }
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

    /// Whether the tier has all the idle workers it wants and no job waits: then one that
    /// skipped its warm-up can be replaced by a warmed one without anyone waiting for it.
    pub(super) fn has_spare_idle(&self) -> bool {
        self.waiters.load(Ordering::Acquire) == 0 && self.idle.len() >= self.wanted()
    }

    /// Lists worker `id`, forked to warm up, as one that may skip it, until the guard is
    /// dropped (when it is Ready, or failed). `sock`: our end of its job socket.
    pub(super) fn warming(&self, id: u64, sock: BorrowedFd<'_>) -> io::Result<WarmingGuard<'_>> {
        let sock = sock.try_clone_to_owned()?;
        self.warming
            .lock()
            .expect("warming lock")
            .push(Warming { id, sock });
        Ok(WarmingGuard { tier: self, id })
    }

    /// Asks the newest worker on its way that still runs the warm-up to skip it, because a
    /// job has started waiting: the fork-time decision ([`Tier::warm_up_next`]) sees only
    /// the jobs waiting when a worker is asked for, and under saturation the next job
    /// usually arrives just after. The newest is the likeliest not to have begun. The
    /// worker looks once, just before its warm-up; if the request comes later it is
    /// set aside. Best effort: a worker that died meanwhile is simply not asked.
    pub(super) fn skip_a_warm_up(&self) {
        let Some(worker) = self.warming.lock().expect("warming lock").pop() else {
            return;
        };
        let bytes = frame::encode(&JobRequest::SkipWarmUp).expect("a fixed request encodes");
        // Nothing else is written to the socket before Ready, so these few bytes fit whole.
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        let _ = nix::sys::socket::send(worker.sock.as_raw_fd(), &bytes, flags);
    }

    /// Counts a job waiting for this tier until the guard is dropped; while any does, the
    /// zygote and the workers on their way run at normal priority ([`Tier::prioritise`]).
    pub(super) fn want(&self) -> WantGuard<'_> {
        if self.waiters.fetch_add(1, Ordering::AcqRel) == 0 {
            self.prioritise();
            self.demand.notify_waiters();
        }
        WantGuard(self)
    }

    /// Jobs routed here that wait for an idle worker.
    pub(super) fn waiting(&self) -> usize {
        self.waiters.load(Ordering::Acquire)
    }

    pub(super) fn status(&self) -> TierStatus {
        let zygote = self.zygote();
        TierStatus {
            name: self.name.clone(),
            state: self.state(),
            start_error: self
                .start_failure
                .lock()
                .expect("start failure lock")
                .clone(),
            preload: self.zygote_config.preload.clone(),
            idle: self.idle.len(),
            spawning: self.spawning.load(Ordering::Relaxed),
            target_idle: self.wanted(),
            checkouts: self.checkouts.load(Ordering::Relaxed),
            workers_spawned: self.spawned.load(Ordering::Relaxed),
            workers_spawned_cold: self.spawned_cold.load(Ordering::Relaxed),
            cold_workers_replaced: self.cold_replaced.load(Ordering::Relaxed),
            zygote: zygote.map(|zygote| ZygoteStatus {
                pid: zygote.info.pid,
                restarts: zygote.restarts,
                alive: zygote.is_alive(),
                python_version: zygote.info.python_version.clone(),
            }),
        }
    }
}

/// Takes a worker off the tier's warming list when dropped.
pub(super) struct WarmingGuard<'a> {
    tier: &'a Tier,
    id: u64,
}

impl Drop for WarmingGuard<'_> {
    fn drop(&mut self) {
        let mut warming = self.tier.warming.lock().expect("warming lock");
        warming.retain(|w| w.id != self.id);
    }
}

pub(super) struct WantGuard<'a>(&'a Tier);

impl Drop for WantGuard<'_> {
    fn drop(&mut self) {
        if self.0.waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.prioritise();
        }
    }
}
