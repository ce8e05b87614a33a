//! The worker pool: prewarming, checkout, replacement, zygote restarts, teardown.
//!
//! - [`zygote`]: the fork server process and its control socket.
//! - [`worker`]: one forked worker (kill on drop), its job socket and workspace.
//! - [`run`]: one job on one worker, with deadline, capture and verdict.
//! - [`capture`]: bounded output buffers.
//! - [`session`]: a worker kept for a session (run, reset, inspect).
//! - [`events`]: what the pool reports as it works (for the metrics).
//! - [`checkout`]: what callers hold (a checked-out worker, a slot, a finished run).
//! - [`status`]: counters and the snapshot `/health` and the metrics read.
//! - `tier`: one zygote with its idle workers; `idle`: one tier's idle set; `slots`: the
//!   execution slots and the FIFO queue; `refill`: forking ahead of demand; `keeper`:
//!   starting and restarting zygotes; `fd`: pipes and fds on the supervisor's side.
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
pub mod checkout;
pub mod events;
mod fd;
mod idle;
mod keeper;
mod refill;
pub mod run;
pub mod session;
mod slots;
pub mod status;
mod tier;
pub mod worker;
pub mod zygote;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use snakecage_worker::protocol::{Job, Layer, ZygoteConfig, ZygoteInfo};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use self::checkout::{AbandonGuard, BusyGuard};
pub use self::checkout::{Checkout, Finished, NoStaging, SessionSlot, Stager};
use self::events::{KillReason, NoEvents, PoolEvents, Rejection};
use self::idle::{IdleSet, Taken};
pub use self::keeper::check_required;
use self::run::{OutputChunk, RunError, RunLimits, RunOutcome};
use self::session::SessionWorker;
use self::slots::Slots;
pub use self::status::{PoolCounters, PoolStatus, ZygoteStatus};
use self::tier::{Tier, TierSettings};
use self::worker::Worker;
use self::zygote::ZygoteError;

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

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    settings: PoolSettings,
    tiers: Vec<Tier>,
    slots: Slots,
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
        let zygote = keeper::start_zygote(&settings, &settings.zygote, 0).await?;
        let tier = TierSettings {
            name: "default".to_owned(),
            zygote: settings.zygote.clone(),
        };
        let shutdown = CancellationToken::new();
        let inner = Arc::new(Inner {
            tiers: vec![Tier::new(tier, zygote, settings.size)],
            slots: Slots::new(
                settings.size,
                settings.queue_length,
                settings.queue_timeout,
                shutdown.clone(),
            ),
            settings,
            next_worker_id: AtomicU64::new(1),
            refill: Notify::new(),
            shutdown,
            counters: PoolCounters::default(),
            events,
        });
        tokio::spawn(refill::refill_loop(inner.clone()));
        for index in 0..inner.tiers.len() {
            tokio::spawn(keeper::zygote_keeper(inner.clone(), index));
        }
        Ok(Self { inner })
    }

    pub fn zygote_info(&self) -> ZygoteInfo {
        self.inner.tiers[0].current_zygote().info.clone()
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
        let inner = &self.inner;
        let deadline = inner.slots.deadline();
        let slot = inner.slots.acquire(&inner.slots.all, deadline).await?;
        let worker = inner.take_idle(deadline).await?;
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
            let abandoned = AbandonGuard::new(&*self.inner.events);
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
        let tier = &inner.tiers[0];
        let zygote = tier.current_zygote();
        PoolStatus {
            target_size: inner.settings.size,
            idle: tier.idle.len(),
            busy: inner.slots.busy.load(Ordering::Relaxed),
            spawning: tier.spawning.load(Ordering::Relaxed),
            queue_depth: inner.slots.waiting.load(Ordering::Relaxed),
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

    /// Stops refilling, kills every idle worker, then the zygotes (which kill and reap
    /// whatever is left), and removes the workspaces.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        inner.slots.close();
        for tier in &inner.tiers {
            tier.idle.close();
            drop(tier.idle.drain());
        }
        let zygotes = inner.tiers.iter().map(|tier| async move {
            tier.current_zygote().shutdown(Duration::from_secs(5)).await;
        });
        futures_util::future::join_all(zygotes).await;
        let _ = std::fs::remove_dir_all(&inner.settings.workspace_root);
    }
}

impl Inner {
    /// An idle worker of the current zygote, waiting (until `deadline`) for the refill.
    async fn take_idle(&self, deadline: tokio::time::Instant) -> Result<Worker, PoolError> {
        let candidates: Vec<&IdleSet> = self.tiers.iter().map(|t| &t.idle).collect();
        loop {
            let (index, taken) = match candidates
                .iter()
                .enumerate()
                .find_map(|(i, set)| set.try_take().map(|taken| (i, taken)))
            {
                Some(found) => found,
                None => {
                    let _waiting = self.slots.waiting();
                    self.slots
                        .wait(IdleSet::take_any(&candidates), deadline)
                        .await?
                }
            };
            self.refill.notify_one();
            let Taken::Worker(mut worker) = taken else {
                continue;
            };
            let tier = &self.tiers[index];
            if worker.generation == tier.current_zygote().generation && worker.is_alive() {
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
