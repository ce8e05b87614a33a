//! The worker pool: prewarming, checkout, replacement, zygote restarts, teardown.
//!
//! - [`zygote`]: the fork server process and its control socket.
//! - [`worker`]: one forked worker (kill on drop), its job socket and workspace.
//! - [`run`]: one job on one worker, with deadline, capture and verdict; `drive`: the
//!   wait for its output, tool calls and result.
//! - [`capture`]: bounded output buffers; [`output_feed`]: a run's output on its way to a
//!   streaming client, which the run never waits for.
//! - [`session`]: a worker kept for a session (run, reset, inspect); [`cpu_budget`]: its
//!   CPU-time budget for each of them, enforced by the kernel or, without the capability
//!   that takes, by `cpu_watchdog`.
//! - [`events`]: what the pool reports as it works (for the metrics).
//! - [`checkout`]: what callers hold (a checked-out worker, a slot, a finished run).
//! - [`status`]: counters and the snapshot `/health` and the metrics read.
//! - `tier`: one zygote with its idle workers; `tiers`: routing jobs to tiers and the
//!   idle targets; `idle`: one tier's idle set; `slots`: the execution slots and the FIFO
//!   queue; `refill`: forking ahead of demand; `keeper`: starting and restarting zygotes;
//!   `fd`: pipes and fds on the supervisor's side.
//! - [`root`]: the workspace root this instance owns (locked), recreated if it vanishes.
//! - [`bound`]: the instance's own tmpfs under it, bounding all its workspaces together.
//! - [`uids`]: the range of worker uids this instance claims, one uid per live worker.
//! - [`uid_accounts`]: the ids the system names, which no worker is given.
//! - [`cgroup`]: the instance's cgroup, bounding all workers together (`pids.max`).
//! - [`toolcalls`]: tool calls answered while a job runs (Code Mode);
//!   [`cancel_cause`]: why a pending call was cancelled, said as it is.
//! - [`generation`]: the generations (one zygote per tier each), the current one, the
//!   retired ones still in use; `rollover`: preparing the next one and switching to it;
//!   `probe`: the sandboxed job a new generation must pass; `take`: taking an idle worker;
//!   `start`: starting the pool, serving before the fuller tiers are up.
//!
//! **Tiers.** The pool runs one zygote per configured tier (`[tiers]`: e.g. `bare`,
//! `scientific` with numpy and pandas, `plotting` with matplotlib too), each with its own
//! idle workers. A job goes to the lightest tier whose preloads cover the modules its code
//! imports, read statically ([`crate::imports`]); when that tier has no idle worker a
//! fuller tier's serves it. Any code runs correctly on any tier (a module that is not
//! preloaded is imported when the job asks for it, just slower), so an import the scanner
//! cannot see (`__import__`, `importlib`) only costs time. Jobs given as an entrypoint
//! file go to the fullest tier, sessions to `tiers.session` (by default the fullest:
//! their later runs may import anything).
//!
//! **Start.** The pool starts every tier's zygote at once and is started as soon as the
//! lightest tier's is up (a fraction of a second: it preloads least, and alone lists the
//! installed packages); the fuller ones come up in the background. A tier serves from its
//! first worker on; until then a job routed to it runs on a tier that serves (see
//! `Generation::serving_tier`), as does a session: one created while its tier starts
//! lives on a lighter tier, and imports what it needs. A fuller tier whose zygote cannot
//! start is `failed`, with why, and retried with backoff; the lightest's failure fails
//! the start (nothing could serve).
//!
//! **`size`** is the number of jobs that run at once (over all tiers), and the number of
//! idle workers kept ready on top of `tiers.min_idle` per tier: every tier keeps its
//! floor, and the `size` others are split over the tiers by an EWMA of recent demand, so
//! the next jobs of the current traffic mix start on warm workers of the right tier.
//! A request takes a slot and an idle worker (waiting in a bounded FIFO queue when all
//! slots are busy), runs one job and drops the worker: a worker is never reused.
//! A background task refills the tiers off the request path (and retires idle workers a
//! tier no longer needs); another per tier restarts its zygote when it dies. Idle workers
//! of a dead zygote died with it and are skipped.
//! When workers cannot be started (spawns keep failing with the zygote alive, or a zygote
//! cannot be restarted) the pool says so ([`Pool::spawn_trouble`]) and a request waiting for
//! a worker is refused at once ([`PoolError::NoWorkers`]) instead of waiting for nothing; the
//! next worker that starts clears it.
//!
//! Sessions take a worker from the idle set too (the refill replaces it) and keep it, but
//! an idle session holds no execution slot: its worker is asleep. Each session *run* takes
//! a slot through the same FIFO queue as a stateless request, and session runs together
//! may hold at most `size − 1` slots (1 when `size` is 1), so stateless traffic always has
//! a slot to flow through however many sessions are busy.

pub mod bound;
pub mod cancel_cause;
pub mod capture;
pub mod cgroup;
pub mod checkout;
pub mod cpu_budget;
mod cpu_watchdog;
mod drive;
pub mod events;
mod fd;
pub mod generation;
mod idle;
mod keeper;
pub mod output_feed;
mod probe;
mod refill;
mod rollover;
pub mod root;
pub mod run;
pub mod session;
mod slots;
mod start;
mod starved;
pub mod status;
mod take;
mod tier;
mod tiers;
pub mod toolcalls;
mod tree;
pub mod uid_accounts;
pub mod uids;
pub mod worker;
pub mod zygote;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use snakecage_worker::protocol::{Job, Layer, ZygoteInfo};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use self::bound::{BoundSettings, WorkspaceUsage};
pub use self::cgroup::CgroupSettings;
use self::checkout::{AbandonGuard, BusyGuard};
pub use self::checkout::{Checkout, Finished, NoStaging, SessionSlot, Stager};
use self::cpu_budget::{CpuBudget, Enforcement};
use self::cpu_watchdog::Watchdog;
use self::events::{KillReason, PoolEvents, Rejection};
use self::generation::{Generation, Generations};
pub use self::generation::{GenerationLease, RetiredGeneration};
pub use self::keeper::check_required;
use self::output_feed::OutputSender;
pub use self::rollover::{PrepareError, Prepared, RolloverStage};
use self::root::WorkspaceRoot;
use self::run::{RunError, RunLimits, RunOutcome};
use self::session::SessionWorker;
use self::slots::Slots;
pub use self::status::{PoolCounters, PoolStatus, TierState, TierStatus, ZygoteStatus};
use self::tier::Tier;
pub use self::tier::TierSettings;
use self::zygote::ZygoteError;

#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Jobs that run at once; also the idle workers spread over the tiers by demand.
    pub size: usize,
    pub queue_length: usize,
    pub queue_timeout: Duration,
    pub spawn_timeout: Duration,
    pub worker_binary: PathBuf,
    /// The instance's workspace root (`<base>/workspaces-<pid>`), claimed at start (the
    /// workspaces are made in its `mount` directory from then on), removed at shutdown.
    pub workspace_root: PathBuf,
    /// The tmpfs bounding every workspace of the instance.
    pub bound: BoundSettings,
    /// The tiers, lightest first; at least one.
    pub tiers: Vec<TierSettings>,
    /// The index in `tiers` of the tier sessions start on.
    pub session_tier: usize,
    /// Idle workers each tier keeps however little demand it sees.
    pub min_idle: usize,
    /// Sandbox layers that must be active; a zygote without one of them is not used.
    pub require: Vec<Layer>,
    /// The worker uids to claim where workers drop privileges.
    pub uids: UidSettings,
    /// The instance's cgroup, bounding all workers together.
    pub cgroup: CgroupSettings,
}

/// `sandbox.uid` and `sandbox.uid_count`, as the pool claims them (see [`uids`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UidSettings {
    /// The first id; `None`: a free block of [`uids::AUTO_FIRST`]–[`uids::AUTO_LAST`].
    pub first: Option<u32>,
    pub count: u32,
    /// Where the claim is locked ([`uids::LOCK_FILE`]).
    pub lock_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("all workers are busy and the wait queue is full")]
    QueueFull,
    #[error("no worker became free within {0:?}")]
    QueueTimeout(Duration),
    #[error("the service is shutting down")]
    ShuttingDown,
    #[error("no worker could take the job: {0}")]
    Unavailable(String),
    /// Workers cannot be started now (the last attempts failed); the pool keeps trying.
    #[error("workers cannot be started: {0}")]
    NoWorkers(String),
    #[error(transparent)]
    Zygote(#[from] ZygoteError),
    #[error("{0}")]
    SandboxRequired(String),
    #[error("workspace root {path}: {source}")]
    WorkspaceRoot {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("worker uids: {0}")]
    Uids(String),
}

/// Code longer than this is scanned for its imports on a blocking thread.
const SCAN_OFF_THREAD_BYTES: usize = 256 << 10;

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    /// The settings the pool started with: its size, queue, binary and workspace root
    /// hold for every generation; the tiers are the first generation's.
    settings: PoolSettings,
    root: WorkspaceRoot,
    generations: Generations,
    slots: Slots,
    next_worker_id: AtomicU64,
    refill: Notify,
    /// Held by one pass of [`refill::stock`] at a time.
    stocking: std::sync::Mutex<()>,
    shutdown: CancellationToken,
    counters: PoolCounters,
    events: Arc<dyn PoolEvents>,
    /// Enforces the CPU-time budgets of session workers where the kernel cannot.
    watchdog: Arc<Watchdog>,
    /// The claimed worker uids, where workers drop privileges (the service runs as root).
    uids: Option<Arc<uids::WorkerUids>>,
    /// The instance's cgroup, while it has one; removed at shutdown.
    cgroup: std::sync::Mutex<Option<cgroup::InstanceCgroup>>,
    /// What every generation's workers are told of it.
    cgroup_plan: snakecage_worker::protocol::CgroupPlan,
    /// Its count of workers killed for memory, where it bounds their memory together.
    oom: Option<cgroup::OomWatch>,
}

impl Pool {
    /// What the current generation's session tier's zygote (by default the fullest)
    /// reported when it started, with the installed packages from the lightest tier's,
    /// which alone describes them.
    pub fn zygote_info(&self) -> ZygoteInfo {
        self.inner.generations.current().zygote_info()
    }

    /// The workspace file system's bound and usage now (`/health`, the metrics); `None`
    /// when it cannot be read (the root removed under us: recreated at the next spawn).
    pub fn workspace_usage(&self) -> Option<WorkspaceUsage> {
        self.inner.root.usage().ok()
    }

    /// The memory of all workers together, its bound and the workers the kernel killed
    /// for it (`/health`, the metrics); `None` where nothing bounds it.
    pub fn workers_memory(&self) -> Option<cgroup::WorkersMemory> {
        self.inner.oom.as_ref().map(cgroup::OomWatch::report)
    }

    /// The worker uids claimed and how many are in use (`/health`); `None` where workers
    /// keep the service's uid.
    pub fn uid_status(&self) -> Option<uids::UidStatus> {
        self.inner.uids.as_ref().map(|uids| uids.status())
    }

    /// Who enforces the CPU-time budget of each run of a new session's worker (`/health`).
    pub fn session_cpu_budget(&self) -> Enforcement {
        self.inner
            .generations
            .current()
            .session_cpu_budget()
            .enforcement
    }

    /// The id of the generation new workers come from (1 at start, one more per rollover).
    pub fn generation(&self) -> u64 {
        self.inner.generations.current().id
    }

    /// The retired generations still in use (by running jobs and sessions).
    pub fn retired_generations(&self) -> Vec<RetiredGeneration> {
        self.inner.generations.retired()
    }

    /// The current generation's tiers' names, lightest first (the label set of the tier
    /// metrics).
    pub fn tier_names(&self) -> Vec<String> {
        let current = self.inner.generations.current();
        current.tiers.iter().map(|t| t.name.clone()).collect()
    }

    pub fn counters(&self) -> &PoolCounters {
        &self.inner.counters
    }

    /// Takes an execution slot and an idle worker of the fullest tier (the code to run is
    /// not known; the fullest that serves while it starts), waiting in the FIFO queue when all `size` slots are busy (or, briefly,
    /// when the refill has not caught up).
    pub async fn acquire(&self) -> Result<Checkout, PoolError> {
        let current = self.inner.generations.current();
        let fullest = current.tiers.len() - 1;
        self.acquire_on(current, fullest).await
    }

    /// [`Pool::acquire`] for a job routed to tier `routed` of generation `generation`.
    async fn acquire_on(
        &self,
        generation: Arc<Generation>,
        routed: usize,
    ) -> Result<Checkout, PoolError> {
        let started = Instant::now();
        let result = self.checkout(generation, routed).await;
        self.inner.observe_wait(started, &result);
        result
    }

    async fn checkout(
        &self,
        generation: Arc<Generation>,
        routed: usize,
    ) -> Result<Checkout, PoolError> {
        let inner = &self.inner;
        let deadline = inner.slots.deadline();
        let slot = inner.slots.acquire(&inner.slots.all, deadline).await?;
        let worker = inner.take_idle(generation, routed, deadline).await?;
        Ok(Checkout {
            worker,
            _slot: slot,
            _busy: BusyGuard::new(inner.clone()),
        })
    }

    /// An execution slot for one session run: a share permit, then a pool slot, both
    /// through the FIFO queue (see the module docs for the share).
    pub async fn acquire_session_slot(&self) -> Result<SessionSlot, PoolError> {
        let started = Instant::now();
        let result = self.session_checkout().await;
        self.inner.observe_wait(started, &result);
        result
    }

    async fn session_checkout(&self) -> Result<SessionSlot, PoolError> {
        let slots = &self.inner.slots;
        let deadline = slots.deadline();
        let share = slots.acquire(&slots.session_share, deadline).await?;
        let slot = slots.acquire(&slots.all, deadline).await?;
        Ok(SessionSlot {
            _share: share,
            _slot: slot,
            _busy: BusyGuard::new(self.inner.clone()),
        })
    }

    /// Takes an idle worker (no slot) and switches it to session mode. A worker lost
    /// before it took the switch is replaced, as for a job.
    pub async fn start_session_worker(&self) -> Result<SessionWorker, PoolError> {
        let mut last_error = String::new();
        for _ in 0..3 {
            let deadline = self.inner.slots.deadline();
            let current = self.inner.generations.current();
            let session = current.table.session;
            let terms = current.session_cpu_budget();
            let worker = self.inner.take_idle(current, session, deadline).await?;
            let budget = CpuBudget::new(worker.pid, worker.pidfd(), terms, &self.inner.watchdog);
            match SessionWorker::start(worker, budget).await {
                Ok(worker) => return Ok(worker),
                Err(e) => {
                    self.inner
                        .counters
                        .workers_lost
                        .fetch_add(1, Ordering::Relaxed);
                    last_error = e.to_string();
                }
            }
        }
        Err(PoolError::Unavailable(last_error))
    }

    /// Runs one job on a fresh worker. A worker that died before taking the job, or that
    /// its zygote's death killed before anything of the job came out of it (no output, no
    /// tool call), is replaced transparently: the job runs again, up to three workers in
    /// all, as if the lost one had never been taken, within what is left of its timeout.
    pub async fn execute(
        &self,
        job: Job,
        limits: &RunLimits,
        chunks: Option<OutputSender>,
    ) -> Result<RunOutcome, PoolError> {
        let finished = self.execute_in(job, limits, chunks, &NoStaging).await?;
        Ok(finished.outcome)
    }

    /// [`Pool::execute`] with a `stager` that fills the workspace first; the workspace is
    /// handed back with the outcome, to be scanned.
    pub async fn execute_in<S: Stager>(
        &self,
        job: Job,
        limits: &RunLimits,
        chunks: Option<OutputSender>,
        stager: &S,
    ) -> Result<Finished<S::Staged>, S::Error> {
        let current = self.inner.generations.current();
        let routed = if job.code.len() > SCAN_OFF_THREAD_BYTES {
            let generation = current.clone();
            let code = job.clone();
            tokio::task::spawn_blocking(move || route(&generation, &code))
                .await
                .unwrap_or(current.tiers.len() - 1)
        } else {
            route(&current, &job)
        };
        let mut last_error = String::new();
        // How long the job ran on workers lost under it: `timeout_ms` bounds the job's run
        // time in all, so a job run again gets what is left (none left: it times out).
        let mut ran = Duration::ZERO;
        let started = Instant::now();
        // A worker lost before anything of the job came out is retried a few times (one
        // whose workspace vanished while idle is skipped by the take itself).
        for _ in 0..3 {
            // A run cancelled while it waits for a slot (or a worker) never starts.
            let checkout = self.acquire_on(current.clone(), routed);
            let cancel = limits.cancel.clone().unwrap_or_default();
            let Checkout {
                mut worker,
                _slot,
                _busy,
            } = tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    return Ok(Finished::cancelled_in_queue(started.elapsed()));
                }
                checkout = checkout => checkout?,
            };
            let abandoned = AbandonGuard::new(&*self.inner.events);
            // A staging failure drops the checkout: the worker is killed, no code ran.
            let staged = match stager.stage(worker.workspace_path()).await {
                Ok(staged) => staged,
                Err(e) => {
                    abandoned.defuse();
                    return Err(e);
                }
            };
            let left = RunLimits {
                timeout: limits.timeout.saturating_sub(ran),
                ..limits.clone()
            };
            let attempt = run::run(&mut worker, job.clone(), &left, chunks.clone()).await;
            abandoned.defuse();
            match attempt {
                Ok(outcome) => {
                    if let Some(reason) = outcome.kill {
                        self.inner.events.worker_killed(reason);
                    }
                    let workspace = worker.take_workspace();
                    return Ok(Finished {
                        outcome,
                        staged: Some(staged),
                        workspace,
                        _slot: Some((_slot, _busy)),
                    });
                }
                Err(lost) => {
                    // Nothing of the job got out of it: it runs again on another worker.
                    let reason = match lost {
                        RunError::WorkerLost(_) => KillReason::LostIdle,
                        RunError::DiedWithItsZygote { ran: lost_after } => {
                            ran += lost_after;
                            KillReason::Crashed
                        }
                    };
                    self.inner
                        .counters
                        .workers_lost
                        .fetch_add(1, Ordering::Relaxed);
                    self.inner.events.worker_killed(reason);
                    tracing::warn!(worker = worker.id, error = %lost, "retrying the job on another worker");
                    last_error = lost.to_string();
                }
            }
        }
        Err(PoolError::Unavailable(last_error).into())
    }

    pub fn status(&self) -> PoolStatus {
        let inner = &self.inner;
        let current = inner.generations.current();
        let tiers: Vec<TierStatus> = current.tiers.iter().map(Tier::status).collect();
        let session = &tiers[current.serving_tier(current.table.session)];
        let zygote = session.zygote.clone().map(|z| ZygoteStatus {
            alive: tiers
                .iter()
                .filter_map(|t| t.zygote.as_ref())
                .all(|z| z.alive),
            ..z
        });
        PoolStatus {
            target_size: inner.settings.size,
            idle: tiers.iter().map(|t| t.idle).sum(),
            busy: inner.slots.busy.load(Ordering::Relaxed),
            spawning: tiers.iter().map(|t| t.spawning).sum(),
            queue_depth: inner.slots.waiting.load(Ordering::Relaxed),
            queue_length: inner.settings.queue_length,
            zygote,
            workers_spawned: inner.counters.workers_spawned.load(Ordering::Relaxed),
            spawn_failures: inner.counters.spawn_failures.load(Ordering::Relaxed),
            zygote_restarts: inner.counters.zygote_restarts.load(Ordering::Relaxed),
            last_spawn_error: inner.counters.spawn_trouble(),
            tiers,
            generation: current.id,
            retired_generations: inner.generations.retired(),
        }
    }

    /// Why workers cannot be started now, if they cannot (see [`PoolStatus`]).
    pub fn spawn_trouble(&self) -> Option<String> {
        self.inner.counters.spawn_trouble()
    }

    /// Stops refilling, kills every idle worker, then the zygotes (which kill and reap
    /// whatever is left), and removes the workspaces.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        inner.slots.close();
        let generations = inner.generations.all();
        for generation in &generations {
            generation.retired.cancel();
            for tier in &generation.tiers {
                tier.idle.close();
                drop(tier.idle.drain());
            }
        }
        futures_util::future::join_all(generations.iter().map(|g| g.shut_down())).await;
        inner.root.remove();
        let cgroup = inner.cgroup.lock().expect("cgroup").take();
        if let Some(mut cgroup) = cgroup {
            // Its workers died with their zygotes; it waits for the last to be gone.
            let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
        }
    }
}

/// The tier of `generation` a job goes to, from the modules its code imports.
fn route(generation: &Generation, job: &Job) -> usize {
    let code = job.entrypoint.is_none().then_some(job.code.as_str());
    generation.table.route(code)
}

impl Inner {
    /// Reports how long a checkout waited, or why it was refused.
    fn observe_wait<T>(&self, started: Instant, result: &Result<T, PoolError>) {
        match result {
            Ok(_) => self.events.queue_wait(started.elapsed()),
            Err(PoolError::QueueFull) => self.events.rejected(Rejection::QueueFull),
            Err(PoolError::QueueTimeout(_)) => {
                self.events.queue_wait(started.elapsed());
                self.events.rejected(Rejection::QueueTimeout);
            }
            Err(PoolError::ShuttingDown) => self.events.rejected(Rejection::ShuttingDown),
            Err(_) => {}
        }
    }
}
