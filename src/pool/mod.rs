//! The worker pool: prewarming, checkout, replacement, zygote restarts, teardown.
//!
//! - [`zygote`]: the fork server process and its control socket.
//! - [`worker`]: one forked worker (kill on drop), its job socket and workspace.
//! - [`run`]: one job on one worker, with deadline, capture and verdict.
//! - [`capture`]: bounded output buffers.
//!
//! `size` is both the number of jobs that run at once and the number of idle workers kept
//! ready, so the next job after a finished one starts on a warm worker at once. A request
//! takes a slot and an idle worker (waiting in a bounded FIFO queue when all slots are
//! busy), runs one job and drops the worker: a worker is never reused.
//! A background task refills the pool off the request path; another restarts the zygote
//! when it dies. Idle workers of a dead zygote died with it and are skipped.

pub mod capture;
pub mod run;
pub mod worker;
pub mod zygote;

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use snakecage_worker::protocol::{Job, Layer, LayerState, WorkerMessage, ZygoteConfig, ZygoteInfo};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use self::run::{OutputChunk, RunError, RunLimits, RunOutcome};
use self::worker::{JobChannel, Worker, Workspace};
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
}

impl Pool {
    /// Starts the zygote (waiting for it to be ready), then the refill and restart tasks.
    pub async fn start(settings: PoolSettings) -> Result<Self, PoolError> {
        let root = &settings.workspace_root;
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
            available: Semaphore::new(0),
            waiting: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            spawning: AtomicUsize::new(0),
            next_worker_id: AtomicU64::new(1),
            refill: Notify::new(),
            shutdown: CancellationToken::new(),
            counters: PoolCounters::default(),
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
        let inner = &self.inner;
        if inner.shutdown.is_cancelled() {
            return Err(PoolError::ShuttingDown);
        }
        let deadline = tokio::time::Instant::now() + inner.settings.queue_timeout;
        let slot = match inner.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if inner.waiting.fetch_add(1, Ordering::AcqRel) >= inner.settings.queue_length {
                    inner.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(PoolError::QueueFull);
                }
                let _waiting = WaitingGuard(&inner.waiting);
                inner
                    .wait(inner.slots.clone().acquire_owned(), deadline)
                    .await?
            }
        };
        loop {
            let permit = match inner.available.try_acquire() {
                Ok(permit) => permit,
                Err(_) => {
                    inner.waiting.fetch_add(1, Ordering::AcqRel);
                    let _waiting = WaitingGuard(&inner.waiting);
                    inner.wait(inner.available.acquire(), deadline).await?
                }
            };
            permit.forget();
            let taken = inner.idle.lock().expect("idle lock").pop_front();
            inner.refill.notify_one();
            let Some(mut worker) = taken else { continue };
            if worker.generation == inner.current_zygote().generation && worker.is_alive() {
                return Ok(Checkout {
                    worker,
                    _slot: slot,
                    _busy: BusyGuard::new(self.inner.clone()),
                });
            }
            // Died with its zygote while idle: skip it, the refill replaces it.
        }
    }

    /// Runs one job on a fresh worker. A worker that died before taking the job (its
    /// zygote just died, say) is replaced transparently: no user code ran on it.
    pub async fn execute(
        &self,
        job: Job,
        limits: &RunLimits,
        chunks: Option<mpsc::Sender<OutputChunk>>,
    ) -> Result<RunOutcome, PoolError> {
        let mut last_error = String::new();
        for _ in 0..3 {
            let Checkout {
                worker,
                _slot,
                _busy,
            } = self.acquire().await?;
            match run::run(worker, job.clone(), limits, chunks.clone()).await {
                Ok(outcome) => return Ok(outcome),
                Err(RunError::WorkerLost(e)) => {
                    self.inner
                        .counters
                        .workers_lost
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "an idle worker was gone when its job arrived; retrying");
                    last_error = e.to_string();
                }
            }
        }
        Err(PoolError::Unavailable(last_error))
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
    }
}

async fn spawn_one(inner: Arc<Inner>, zygote: Arc<ZygoteHandle>) {
    match spawn_worker(&inner, &zygote).await {
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
        inner.idle.lock().expect("idle lock").clear();
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
