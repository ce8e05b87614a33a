//! The worker pool: prewarming, checkout, replacement, zygote restarts, teardown.
//!
//! - [`zygote`]: the fork server process and its control socket.
//! - [`worker`]: one forked worker (kill on drop), its job socket and workspace.
//! - [`run`]: one job on one worker, with deadline, capture and verdict.
//! - [`capture`]: bounded output buffers.
//! - [`session`]: a worker kept for a session (run, reset, inspect).
//! - [`events`]: what the pool reports as it works (for the metrics).
//!
//! `size` is both the number of jobs that run at once and the number of idle workers kept
//! ready, so the next job after a finished one starts on a warm worker at once. A request
//! takes a slot and an idle worker (waiting in a bounded FIFO queue when all slots are
//! busy), runs one job and drops the worker: a worker is never reused.
//! A background task refills the pool off the request path; another restarts the zygote
//! when it dies. Idle workers of a dead zygote died with it and are skipped.
//!
//! Sessions take a worker from the idle set too (the refill replaces it) and keep it, but
//! an idle session holds no execution slot: its worker is asleep. Each session *run* takes
//! a slot through the same FIFO queue as a stateless request, and session runs together
//! may hold at most `size − 1` slots (1 when `size` is 1), so stateless traffic always has
//! a slot to flow through however many sessions are busy.

pub mod capture;
pub mod events;
pub mod run;
pub mod session;
pub mod worker;
pub mod zygote;

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use snakecage_worker::protocol::{Job, Layer, LayerState, WorkerMessage, ZygoteConfig, ZygoteInfo};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use self::events::{KillReason, NoEvents, PoolEvents, Rejection};
use self::run::{OutputChunk, RunError, RunLimits, RunOutcome};
use self::session::SessionWorker;
use self::worker::{JobChannel, Worker, Workspace};

/// Fills a fresh worker's workspace before its job is sent (staging input files). Called
/// again, on another worker, when the first one was lost before it took the job.
pub trait Stager: Sync {
    type Staged: Send;
    type Error: From<PoolError> + Send;

    fn stage(
        &self,
        workspace: &std::path::Path,
    ) -> impl std::future::Future<Output = Result<Self::Staged, Self::Error>> + Send;
}

/// Stages nothing.
pub struct NoStaging;

impl Stager for NoStaging {
    type Staged = ();
    type Error = PoolError;

    async fn stage(&self, _: &std::path::Path) -> Result<(), PoolError> {
        Ok(())
    }
}

/// A finished run: its outcome, what staging returned, and its workspace, which the
/// caller may scan. The worker is dead; the execution slot stays taken and the workspace
/// stays on disk until this is dropped.
pub struct Finished<S> {
    pub outcome: RunOutcome,
    pub staged: S,
    workspace: Option<Workspace>,
    _slot: OwnedSemaphorePermit,
    _busy: BusyGuard,
}

impl<S> Finished<S> {
    pub fn workspace_path(&self) -> Option<&std::path::Path> {
        self.workspace.as_ref().map(|w| w.path.as_path())
    }
}
use self::zygote::{ZygoteError, ZygoteHandle};

#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub size: usize,
    pub queue_length: usize,
    pub queue_timeout: Duration,
    pub spawn_timeout: Duration,
    pub worker_binary: PathBuf,
    /// Parent of the per-worker workspaces; created at start, removed at shutdown.
    pub workspace_root: PathBuf,
    pub zygote: ZygoteConfig,
    /// Sandbox layers that must be active; a zygote without one of them is not used.
    pub require: Vec<Layer>,
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
    #[error(transparent)]
    Zygote(#[from] ZygoteError),
    #[error("{0}")]
    SandboxRequired(String),
    #[error("workspace root {path}: {source}")]
    WorkspaceRoot {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
enum SpawnError {
    #[error("workspace: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Zygote(#[from] ZygoteError),
    #[error("worker {pid} did not become ready: {reason}")]
    NotReady { pid: i32, reason: String },
}

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
}

#[derive(Debug, Clone, Serialize)]
pub struct ZygoteStatus {
    pub pid: i32,
    pub generation: u64,
    pub alive: bool,
    pub python_version: String,
}

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    settings: PoolSettings,
    zygote: RwLock<Arc<ZygoteHandle>>,
    idle: Mutex<VecDeque<Worker>>,
    /// One permit per concurrent execution: `size` jobs run at once, the rest queue.
    slots: Arc<Semaphore>,
    /// The share of `slots` session runs may hold at once: `max(1, size − 1)`.
    session_share: Arc<Semaphore>,
    /// One permit per idle worker (possibly more, after stale workers were purged: a taker
    /// that finds the deque empty simply waits again).
    available: Semaphore,
    waiting: AtomicUsize,
    busy: AtomicUsize,
    spawning: AtomicUsize,
    next_worker_id: AtomicU64,
    refill: Notify,
    shutdown: CancellationToken,
    counters: PoolCounters,
    events: Arc<dyn PoolEvents>,
}

impl Pool {
    /// Starts the zygote (waiting for it to be ready), then the refill and restart tasks.
    pub async fn start(settings: PoolSettings) -> Result<Self, PoolError> {
        Self::start_observed(settings, Arc::new(NoEvents)).await
    }

    /// [`Pool::start`], reporting queue waits, spawns, kills and restarts to `events`.
    pub async fn start_observed(
        settings: PoolSettings,
        events: Arc<dyn PoolEvents>,
    ) -> Result<Self, PoolError> {
        let root = &settings.workspace_root;
        if let Some(parent) = root.parent() {
            remove_abandoned_workspace_roots(parent);
        }
        std::fs::create_dir_all(root).map_err(|source| PoolError::WorkspaceRoot {
            path: root.clone(),
            source,
        })?;
        let zygote = ZygoteHandle::start(
            &settings.worker_binary,
            &settings.zygote,
            0,
            settings.spawn_timeout * 4,
        )
        .await?;
        if let Err(e) = check_required(&zygote.info, &settings.require) {
            zygote.shutdown(Duration::from_secs(5)).await;
            return Err(PoolError::SandboxRequired(e));
        }
        let size = settings.size;
        let inner = Arc::new(Inner {
            settings,
            zygote: RwLock::new(zygote),
            idle: Mutex::new(VecDeque::new()),
            slots: Arc::new(Semaphore::new(size)),
            session_share: Arc::new(Semaphore::new(size.saturating_sub(1).max(1))),
            available: Semaphore::new(0),
            waiting: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            spawning: AtomicUsize::new(0),
            next_worker_id: AtomicU64::new(1),
            refill: Notify::new(),
            shutdown: CancellationToken::new(),
            counters: PoolCounters::default(),
            events,
        });
        tokio::spawn(refill_loop(inner.clone()));
        tokio::spawn(zygote_keeper(inner.clone()));
        Ok(Self { inner })
    }

    pub fn zygote_info(&self) -> ZygoteInfo {
        self.inner.current_zygote().info.clone()
    }

    pub fn counters(&self) -> &PoolCounters {
        &self.inner.counters
    }

    /// Takes an execution slot and an idle worker, waiting in the FIFO queue when all
    /// `size` slots are busy (or, briefly, when the refill has not caught up).
    pub async fn acquire(&self) -> Result<Checkout, PoolError> {
        let started = Instant::now();
        let result = self.checkout().await;
        self.inner.observe_wait(started, &result);
        result
    }

    async fn checkout(&self) -> Result<Checkout, PoolError> {
        let deadline = tokio::time::Instant::now() + self.inner.settings.queue_timeout;
        let slot = self.inner.acquire_slot(&self.inner.slots, deadline).await?;
        let worker = self.inner.take_idle(deadline).await?;
        Ok(Checkout {
            worker,
            _slot: slot,
            _busy: BusyGuard::new(self.inner.clone()),
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
        let inner = &self.inner;
        let deadline = tokio::time::Instant::now() + inner.settings.queue_timeout;
        let share = inner.acquire_slot(&inner.session_share, deadline).await?;
        let slot = inner.acquire_slot(&inner.slots, deadline).await?;
        Ok(SessionSlot {
            _share: share,
            _slot: slot,
            _busy: BusyGuard::new(inner.clone()),
        })
    }

    /// Takes an idle worker (no slot) and switches it to session mode. A worker lost
    /// before it took the switch is replaced, as for a job.
    pub async fn start_session_worker(&self) -> Result<SessionWorker, PoolError> {
        let mut last_error = String::new();
        for _ in 0..3 {
            let deadline = tokio::time::Instant::now() + self.inner.settings.queue_timeout;
            let worker = self.inner.take_idle(deadline).await?;
            match SessionWorker::start(worker).await {
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

    /// Runs one job on a fresh worker. A worker that died before taking the job (its
    /// zygote just died, say) is replaced transparently: no user code ran on it.
    pub async fn execute(
        &self,
        job: Job,
        limits: &RunLimits,
        chunks: Option<mpsc::Sender<OutputChunk>>,
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
        chunks: Option<mpsc::Sender<OutputChunk>>,
        stager: &S,
    ) -> Result<Finished<S::Staged>, S::Error> {
        let mut last_error = String::new();
        for _ in 0..3 {
            let Checkout {
                mut worker,
                _slot,
                _busy,
            } = self.acquire().await?;
            let abandoned = AbandonGuard(Some(&*self.inner.events));
            // A staging failure drops the checkout: the worker is killed, no code ran.
            let staged = match stager.stage(worker.workspace_path()).await {
                Ok(staged) => staged,
                Err(e) => {
                    abandoned.defuse();
                    return Err(e);
                }
            };
            let ran = run::run(&mut worker, job.clone(), limits, chunks.clone()).await;
            abandoned.defuse();
            match ran {
                Ok(outcome) => {
                    if let Some(reason) = outcome.kill {
                        self.inner.events.worker_killed(reason);
                    }
                    let workspace = worker.take_workspace();
                    return Ok(Finished {
                        outcome,
                        staged,
                        workspace,
                        _slot,
                        _busy,
                    });
                }
                Err(RunError::WorkerLost(e)) => {
                    self.inner
                        .counters
                        .workers_lost
                        .fetch_add(1, Ordering::Relaxed);
                    self.inner.events.worker_killed(KillReason::LostIdle);
                    tracing::warn!(error = %e, "an idle worker was gone when its job arrived; retrying");
                    last_error = e.to_string();
                }
            }
        }
        Err(PoolError::Unavailable(last_error).into())
    }

    pub fn status(&self) -> PoolStatus {
        let inner = &self.inner;
        let zygote = inner.current_zygote();
        PoolStatus {
            target_size: inner.settings.size,
            idle: inner.idle.lock().expect("idle lock").len(),
            busy: inner.busy.load(Ordering::Relaxed),
            spawning: inner.spawning.load(Ordering::Relaxed),
            queue_depth: inner.waiting.load(Ordering::Relaxed),
            queue_length: inner.settings.queue_length,
            zygote: Some(ZygoteStatus {
                pid: zygote.info.pid,
                generation: zygote.generation,
                alive: zygote.is_alive(),
                python_version: zygote.info.python_version.clone(),
            }),
            workers_spawned: inner.counters.workers_spawned.load(Ordering::Relaxed),
            spawn_failures: inner.counters.spawn_failures.load(Ordering::Relaxed),
            zygote_restarts: inner.counters.zygote_restarts.load(Ordering::Relaxed),
        }
    }

    /// Stops refilling, kills every idle worker, then the zygote (which kills and reaps
    /// whatever is left), and removes the workspaces.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        inner.available.close();
        inner.slots.close();
        inner.session_share.close();
        inner.idle.lock().expect("idle lock").clear();
        inner
            .current_zygote()
            .shutdown(Duration::from_secs(5))
            .await;
        let _ = std::fs::remove_dir_all(&inner.settings.workspace_root);
    }
}

impl Inner {
    fn current_zygote(&self) -> Arc<ZygoteHandle> {
        self.zygote.read().expect("zygote lock").clone()
    }

    /// A permit of `sem`, at once or after waiting in the bounded queue until `deadline`.
    async fn acquire_slot(
        &self,
        sem: &Arc<Semaphore>,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedSemaphorePermit, PoolError> {
        if self.shutdown.is_cancelled() {
            return Err(PoolError::ShuttingDown);
        }
        match sem.clone().try_acquire_owned() {
            Ok(slot) => Ok(slot),
            Err(_) => {
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.settings.queue_length {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(PoolError::QueueFull);
                }
                let _waiting = WaitingGuard(&self.waiting);
                self.wait(sem.clone().acquire_owned(), deadline).await
            }
        }
    }

    /// An idle worker of the current zygote, waiting (until `deadline`) for the refill.
    async fn take_idle(&self, deadline: tokio::time::Instant) -> Result<Worker, PoolError> {
        loop {
            let permit = match self.available.try_acquire() {
                Ok(permit) => permit,
                Err(_) => {
                    self.waiting.fetch_add(1, Ordering::AcqRel);
                    let _waiting = WaitingGuard(&self.waiting);
                    self.wait(self.available.acquire(), deadline).await?
                }
            };
            permit.forget();
            let taken = self.idle.lock().expect("idle lock").pop_front();
            self.refill.notify_one();
            let Some(mut worker) = taken else { continue };
            if worker.generation == self.current_zygote().generation && worker.is_alive() {
                return Ok(worker);
            }
            // Died with its zygote while idle: skip it, the refill replaces it.
            self.events.worker_killed(KillReason::LostIdle);
        }
    }

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

    /// Awaits `fut` (a semaphore acquire) until `deadline`, or until shutdown.
    async fn wait<P, E>(
        &self,
        fut: impl std::future::Future<Output = Result<P, E>>,
        deadline: tokio::time::Instant,
    ) -> Result<P, PoolError> {
        tokio::select! {
            got = tokio::time::timeout_at(deadline, fut) => match got {
                Ok(Ok(permit)) => Ok(permit),
                Ok(Err(_closed)) => Err(PoolError::ShuttingDown),
                Err(_elapsed) => Err(PoolError::QueueTimeout(self.settings.queue_timeout)),
            },
            () = self.shutdown.cancelled() => Err(PoolError::ShuttingDown),
        }
    }
}

/// A worker checked out for one job, with the execution slot it occupies. Dropping it
/// (after the run, or when the request is abandoned) kills the worker and frees the slot.
pub struct Checkout {
    pub worker: Worker,
    _slot: OwnedSemaphorePermit,
    _busy: BusyGuard,
}

/// The execution slot of one session run; dropping it frees the slot.
pub struct SessionSlot {
    _share: OwnedSemaphorePermit,
    _slot: OwnedSemaphorePermit,
    _busy: BusyGuard,
}

struct BusyGuard(Arc<Inner>);

impl BusyGuard {
    fn new(inner: Arc<Inner>) -> Self {
        inner.busy.fetch_add(1, Ordering::Relaxed);
        Self(inner)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Reports an abandoned job when a request is dropped (its client went away) while its
/// worker is staged or running; the dropped checkout kills the worker.
struct AbandonGuard<'a>(Option<&'a dyn PoolEvents>);

impl AbandonGuard<'_> {
    fn defuse(mut self) {
        self.0 = None;
    }
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if let Some(events) = self.0 {
            events.worker_killed(KillReason::Abandoned);
        }
    }
}

struct WaitingGuard<'a>(&'a AtomicUsize);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Keeps `idle + spawning == size`, spawning concurrently; woken whenever a worker is
/// taken, a spawn ends or the zygote is replaced.
async fn refill_loop(inner: Arc<Inner>) {
    loop {
        let zygote = inner.current_zygote();
        if zygote.is_alive() {
            let idle = inner.idle.lock().expect("idle lock").len();
            let spawning = inner.spawning.load(Ordering::Acquire);
            for _ in 0..inner.settings.size.saturating_sub(idle + spawning) {
                inner.spawning.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(spawn_one(inner.clone(), zygote.clone()));
            }
        }
        tokio::select! {
            () = inner.refill.notified() => {}
            () = inner.shutdown.cancelled() => return,
        }
        // Usually a worker was just taken and its job is being sent. Forking a zygote this
        // size holds a CPU in the kernel for a millisecond or more where nothing preempts it
        // (PREEMPT_NONE, `SCHED_IDLE` or not), and the job's worker may be woken onto that
        // CPU: let a short job run first.
        tokio::time::sleep(REFILL_DELAY).await;
    }
}

/// How long the refill waits after being woken before it forks.
const REFILL_DELAY: Duration = Duration::from_millis(2);

async fn spawn_one(inner: Arc<Inner>, zygote: Arc<ZygoteHandle>) {
    let started = Instant::now();
    let spawned = spawn_worker(&inner, &zygote).await;
    match &spawned {
        Ok(_) => inner.events.worker_spawned(started.elapsed()),
        Err(SpawnError::NotReady { .. }) => inner.events.worker_killed(KillReason::NotReady),
        Err(_) => inner.events.spawn_failed(),
    }
    match spawned {
        Ok(worker) => {
            inner
                .counters
                .workers_spawned
                .fetch_add(1, Ordering::Relaxed);
            if !inner.shutdown.is_cancelled() {
                inner.idle.lock().expect("idle lock").push_back(worker);
                inner.available.add_permits(1);
            }
        }
        Err(e) => {
            inner
                .counters
                .spawn_failures
                .fetch_add(1, Ordering::Relaxed);
            if zygote.is_alive() && !inner.shutdown.is_cancelled() {
                tracing::error!(error = %e, "could not start a worker");
                // Do not spin on a failure that repeats (a broken sandbox layer, say).
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    inner.spawning.fetch_sub(1, Ordering::AcqRel);
    inner.refill.notify_one();
}

async fn spawn_worker(inner: &Inner, zygote: &ZygoteHandle) -> Result<Worker, SpawnError> {
    let id = inner.next_worker_id.fetch_add(1, Ordering::Relaxed);
    let (workspace, workspace_fd) = Workspace::create(
        &inner.settings.workspace_root,
        id,
        workspace_owner(inner, zygote),
    )?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let (stdout_r, stdout_w) = nonblocking_read_pipe()?;
    let (stderr_r, stderr_w) = nonblocking_read_pipe()?;
    let fds = [OwnedFd::from(theirs), stdout_w, stderr_w, workspace_fd];
    let forked = zygote.fork(id, fds).await?;
    let pid = forked.pid;
    let channel = JobChannel::new(tokio::net::UnixStream::from_std(ours)?);
    let mut worker = Worker::new(
        id,
        zygote.generation,
        forked,
        channel,
        stdout_r,
        stderr_r,
        workspace,
    )?;
    let reason =
        match tokio::time::timeout(inner.settings.spawn_timeout, worker.channel.recv()).await {
            Ok(Ok(Some(WorkerMessage::Ready))) => return Ok(worker),
            Ok(Ok(Some(other))) => format!("sent {other:?} instead of ready"),
            Ok(Ok(None)) => {
                let status = worker.exit_status(Duration::from_secs(1)).await;
                format!("exited ({status:?}): {}", read_available(&worker.stderr))
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("not ready after {:?}", inner.settings.spawn_timeout),
        };
    Err(SpawnError::NotReady { pid, reason })
}

/// Removes `workspaces-<pid>` directories left by supervisors that died without shutting
/// down (SIGKILL, a crash): on a tmpfs they would hold memory until reboot.
fn remove_abandoned_workspace_roots(parent: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("workspaces-")) else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive {
            tracing::info!(path = %entry.path().display(), "removing workspaces left by a supervisor that is gone");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A pipe whose read end (ours) is non-blocking and whose write end (the worker's) blocks.
fn nonblocking_read_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let flags = nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok((r, w))
}

/// What a dead worker left in its stderr pipe (why it failed to start), bounded.
fn read_available(fd: &tokio::io::unix::AsyncFd<OwnedFd>) -> String {
    let mut buf = vec![0u8; 4096];
    let n = worker::read_pipe(fd, &mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).trim().to_owned()
}

/// The uid and gid a new worker's workspace belongs to: the sandbox ids when workers drop
/// to them, else none (the workspace stays ours, which is also the workers' uid).
fn workspace_owner(inner: &Inner, zygote: &ZygoteHandle) -> Option<(u32, u32)> {
    let drops = zygote
        .info
        .sandbox
        .iter()
        .any(|r| r.layer == Layer::DropPrivileges && r.state == LayerState::Active);
    let sandbox = &inner.settings.zygote.sandbox;
    drops.then_some((sandbox.uid, sandbox.gid))
}

/// Ok when every layer in `require` is active in the zygote described by `info`.
pub fn check_required(info: &ZygoteInfo, require: &[Layer]) -> Result<(), String> {
    let missing: Vec<String> = require
        .iter()
        .filter_map(|layer| {
            let report = info.sandbox.iter().find(|r| r.layer == *layer);
            match report {
                Some(r) if r.state == LayerState::Active => None,
                Some(r) => Some(format!("{} is {:?}: {}", layer.as_str(), r.state, r.detail)),
                None => Some(format!("{} was not reported", layer.as_str())),
            }
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "sandbox.require names layers that are not active: {}",
            missing.join("; ")
        ))
    }
}

/// Restarts the zygote whenever it dies, with backoff, and wakes the refill.
async fn zygote_keeper(inner: Arc<Inner>) {
    loop {
        let current = inner.current_zygote();
        tokio::select! {
            () = current.died() => {}
            () = inner.shutdown.cancelled() => return,
        }
        if inner.shutdown.is_cancelled() {
            return;
        }
        tracing::error!(pid = current.info.pid, "the zygote died; restarting it");
        // Its idle workers died with it.
        let lost = std::mem::take(&mut *inner.idle.lock().expect("idle lock"));
        for _ in &lost {
            inner.events.worker_killed(KillReason::LostIdle);
        }
        drop(lost);
        let mut backoff = Duration::from_millis(100);
        loop {
            let s = &inner.settings;
            let started = ZygoteHandle::start(
                &s.worker_binary,
                &s.zygote,
                current.generation + 1,
                s.spawn_timeout * 4,
            );
            tokio::select! {
                result = started => match result {
                    Ok(zygote) if check_required(&zygote.info, &s.require).is_err() => {
                        let e = check_required(&zygote.info, &s.require).unwrap_err();
                        tracing::error!(error = %e, "the restarted zygote is missing a required sandbox layer; retrying");
                        zygote.shutdown(Duration::from_secs(5)).await;
                    }
                    Ok(zygote) => {
                        *inner.zygote.write().expect("zygote lock") = zygote;
                        inner.counters.zygote_restarts.fetch_add(1, Ordering::Relaxed);
                        inner.events.zygote_restarted();
                        inner.refill.notify_one();
                        break;
                    }
                    Err(e) => tracing::error!(error = %e, "restarting the zygote failed; retrying"),
                },
                () = inner.shutdown.cancelled() => return,
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use snakecage_worker::protocol::LayerReport;

    use super::*;

    fn info(layers: &[(Layer, LayerState)]) -> ZygoteInfo {
        ZygoteInfo {
            pid: 1,
            python_version: "3.11.7".into(),
            preloaded: Vec::new(),
            preload_failures: Vec::new(),
            sandbox: layers
                .iter()
                .map(|&(layer, state)| LayerReport {
                    layer,
                    state,
                    detail: "why".into(),
                })
                .collect(),
            packages: Vec::new(),
        }
    }

    #[test]
    fn a_required_layer_that_is_not_active_fails_with_its_reason() {
        let zygote = info(&[
            (Layer::Seccomp, LayerState::Active),
            (Layer::Landlock, LayerState::Unavailable),
            (Layer::AuditHook, LayerState::Off),
        ]);
        assert_eq!(check_required(&zygote, &[]), Ok(()));
        assert_eq!(check_required(&zygote, &[Layer::Seccomp]), Ok(()));
        let err = check_required(
            &zygote,
            &[
                Layer::Seccomp,
                Layer::Landlock,
                Layer::AuditHook,
                Layer::NetworkNamespace,
            ],
        )
        .unwrap_err();
        assert!(err.contains("landlock is Unavailable: why"), "{err}");
        assert!(err.contains("audit_hook is Off"), "{err}");
        assert!(err.contains("network_namespace was not reported"), "{err}");
        assert!(!err.contains("seccomp"), "{err}");
    }
}
