//! Keeping every tier stocked: workers are forked ahead of demand, off the request path,
//! until each tier has as many idle (or starting) workers as its target; and the idle
//! workers a tier no longer needs are retired when its target falls. A take asks for its
//! replacement itself ([`stock`], from the task that is awake anyway); the refill task
//! does the rest (start-up, failed spawns, new targets, zygote restarts, rollovers).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use snakecage_worker::protocol::{Layer, LayerState, WorkerMessage};

use super::Inner;
use super::events::KillReason;
use super::fd::{nonblocking_read_pipe, read_available};
use super::generation::Generation;
use super::starved::{SchedStat, patience, starved, waiting_in};
use super::status::TierState;
use super::tier::Tier;
use super::worker::{JobChannel, Worker, Workspace};
use super::zygote::{ZygoteError, ZygoteHandle};

#[derive(Debug, thiserror::Error)]
enum SpawnError {
    #[error("workspace: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Zygote(#[from] ZygoteError),
    #[error("worker {pid} did not become ready: {reason}")]
    NotReady { pid: i32, reason: String },
    #[error("{0}")]
    NoUid(String),
}

/// Keeps `idle + spawning == target` in every tier of the current generation (and of the
/// one a rollover is preparing), spawning concurrently; woken when a spawn fails, a tier's
/// first worker starts, a target moves, a zygote is replaced or a generation starts.
///
/// It does not wait before it asks: the zygote itself holds a fork request back until the
/// job just sent has had the CPU (`FORK_DELAY` in the worker's `zygote.rs`).
pub(super) async fn refill_loop(inner: Arc<Inner>) {
    loop {
        for generation in inner.generations.stocked() {
            stock(&inner, &generation);
        }
        tokio::select! {
            () = inner.refill.notified() => {}
            () = inner.shutdown.cancelled() => return,
        }
    }
}

/// One pass over `generation`'s tiers: retire the idle workers a tier no longer needs,
/// spawn those it lacks. Called by the refill task and by each take; one pass at a time,
/// so two that run together do not both spawn the same missing worker.
pub(super) fn stock(inner: &Arc<Inner>, generation: &Arc<Generation>) {
    if generation.retired.is_cancelled() {
        return;
    }
    let _one_at_a_time = inner.stocking.lock().expect("stocking lock");
    // While a generation starts (the service's first, or one a rollover prepares), one
    // worker per tier first, and one per job waiting: the rest would only compete for the
    // CPUs with the tiers still preloading and with their first workers. Bounded in time:
    // a tier whose workers cannot start does not keep the others at one.
    let starting = generation.began.elapsed() < START_UP_ONE_EACH
        && generation
            .tiers
            .iter()
            .any(|t| t.state() == TierState::Starting && t.wanted() > 0);
    {
        for (index, tier) in generation.tiers.iter().enumerate() {
            let Some(zygote) = tier.zygote().filter(|z| z.is_alive()) else {
                continue;
            };
            let wanted = tier.wanted();
            // Retire idle workers the tier no longer needs (with a margin of one, so a
            // target that wavers does not churn forks).
            while tier.idle.len() > wanted + 1 {
                if tier.idle.retire_newest().is_none() {
                    break;
                }
            }
            let wanted = if starting {
                wanted.min(tier.waiting().max(1))
            } else {
                // One more while an idle worker skipped its warm-up and no job waits: the
                // warmed one replaces it (see `spawn_one`).
                wanted + usize::from(tier.warm_up_next() && tier.idle.has_cold())
            };
            for _ in 0..wanted.saturating_sub(tier.stocked()) {
                tier.spawning.fetch_add(1, Ordering::AcqRel);
                tokio::spawn(spawn_one(
                    inner.clone(),
                    generation.clone(),
                    index,
                    zygote.clone(),
                ));
            }
        }
    }
}

/// How long after start the refill gives each tier its first worker before the rest.
const START_UP_ONE_EACH: Duration = Duration::from_secs(10);

async fn spawn_one(
    inner: Arc<Inner>,
    generation: Arc<Generation>,
    index: usize,
    zygote: Arc<ZygoteHandle>,
) {
    let tier = &generation.tiers[index];
    let started = Instant::now();
    // A tier's first worker skips the warm-up: it is what the service (or a rollover)
    // waits for to be ready, and the plotting tier's warm-up (a figure to PNG, ~90 ms) is
    // the longest part of it. The warmed workers that follow replace it.
    let first_of_tier = tier.spawned.load(Ordering::Relaxed) == 0;
    let warm_up = tier.warm_up_next() && !first_of_tier;
    let spawned = spawn_worker(&inner, &generation, tier, &zygote, warm_up).await;
    count_spawn(&inner, started, &spawned);
    let failed = spawned.is_err();
    let mut notify = false;
    match spawned {
        Ok(worker) => {
            if !worker.warmed {
                tier.spawned_cold.fetch_add(1, Ordering::Relaxed);
                inner.events.worker_started_cold(&tier.name);
            }
            inner.counters.spawn_succeeded();
            // A retired generation's new worker is dropped (killed): it would serve nobody.
            if !inner.shutdown.is_cancelled() && !generation.retired.is_cancelled() {
                tier.idle.push(worker);
                // Counted once it can be taken: from its tier's first, jobs routed here
                // are served here (`Tier::serves`).
                tier.spawned.fetch_add(1, Ordering::Release);
                // One made while jobs waited (or first) is replaced by a warmed one once
                // none waits (`stock` asks for the extra), so neither a burst nor the
                // start leaves the next requests slower.
                if tier.has_spare_idle() && tier.idle.retire_a_cold_one().is_some() {
                    tier.cold_replaced.fetch_add(1, Ordering::Relaxed);
                    notify = true;
                }
            }
        }
        Err(e) => {
            if zygote.is_alive() && !inner.shutdown.is_cancelled() {
                tracing::error!(tier = %tier.name, generation = generation.id, error = %e, "could not start a worker");
                // A worker of a zygote that is being replaced says nothing about the next;
                // one of a generation being prepared says nothing about the one serving.
                let serving = inner.generations.is_current(&generation);
                let restarts = tier.zygote().map(|z| z.restarts);
                if serving && restarts == Some(zygote.restarts) {
                    inner.counters.spawn_failed(e.to_string());
                }
                // Do not spin on a failure that repeats (a broken sandbox layer, say).
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    // A worker that started leaves the tier as stocked as before (one less spawning, one
    // more idle): the refill is only needed after a failure, or when a tier's first worker
    // may let the others start theirs (`stock` gives each tier one first at start-up).
    let first = tier.spawned.load(Ordering::Relaxed) == 1;
    tier.spawning.fetch_sub(1, Ordering::AcqRel);
    if failed || first || notify {
        inner.refill.notify_one();
    }
}

/// A worker of `generation`'s tier `index` for a job of the pool's own (a rollover's
/// probe), forked apart from the idle set: a tier's idle target is what demand and
/// `tiers.min_idle` ask for, possibly none, and the probe must neither wait for an idle
/// worker such a tier never gets nor leave it one it should not keep. A failed spawn is
/// retried (a busy host, a workspace removed meanwhile) for `timeout`; the error is the
/// last one's.
pub(super) async fn spawn_apart(
    inner: &Inner,
    generation: &Generation,
    index: usize,
    timeout: Duration,
) -> Result<Worker, String> {
    let tier = &generation.tiers[index];
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        // A rollover's generation has every zygote up; one that died is being restarted.
        let Some(zygote) = tier.zygote() else {
            let error = "its zygote is not running".to_owned();
            if tokio::time::Instant::now() >= deadline {
                return Err(last.unwrap_or(error));
            }
            last = Some(error);
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        };
        let started = Instant::now();
        let attempt = spawn_worker(inner, generation, tier, &zygote, false);
        let error = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(spawned) => {
                count_spawn(inner, started, &spawned);
                match spawned {
                    Ok(worker) => return Ok(worker),
                    Err(e) => {
                        tracing::error!(tier = %tier.name, generation = generation.id, error = %e, "could not start a worker");
                        e.to_string()
                    }
                }
            }
            Err(_) => last.unwrap_or_else(|| format!("none was ready within {timeout:?}")),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(error);
        }
        last = Some(error);
        // Do not spin on a failure that repeats (a broken sandbox layer, say).
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Counts a spawn's outcome, the refill's or a probe's, in the pool's counters and events.
fn count_spawn(inner: &Inner, started: Instant, spawned: &Result<Worker, SpawnError>) {
    match spawned {
        Ok(_) => {
            inner.events.worker_spawned(started.elapsed());
            inner
                .counters
                .workers_spawned
                .fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            match e {
                SpawnError::NotReady { .. } => inner.events.worker_killed(KillReason::NotReady),
                _ => inner.events.spawn_failed(),
            }
            inner
                .counters
                .spawn_failures
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn spawn_worker(
    inner: &Inner,
    generation: &Generation,
    tier: &Tier,
    zygote: &ZygoteHandle,
    warm_up: bool,
) -> Result<Worker, SpawnError> {
    let id = inner.next_worker_id.fetch_add(1, Ordering::Relaxed);
    // A uid no other live worker has, where workers drop to one: waited for when every one
    // is in use (workers not reaped yet, workspaces not removed yet), never shared.
    let uid = match (&inner.uids, drops_privileges(zygote)) {
        (Some(uids), true) => Some(
            uids.lease(inner.settings.spawn_timeout)
                .await
                .map_err(SpawnError::NoUid)?,
        ),
        _ => None,
    };
    let gid = tier.zygote_config.sandbox.gid;
    let owner = || uid.clone().map(|uid| (uid, gid));
    let root = &inner.settings.workspace_root;
    let (workspace, workspace_fd) = match Workspace::create(root, id, owner()) {
        Ok(created) => created,
        // The root was removed under us (by hand, by another program): recreate it.
        Err(_) if inner.root.ensure()? => Workspace::create(root, id, owner())?,
        Err(e) => return Err(e.into()),
    };
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let (stdout_r, stdout_w) = nonblocking_read_pipe()?;
    let (stderr_r, stderr_w) = nonblocking_read_pipe()?;
    // Listed before the fork is asked for, so a job that starts waiting meanwhile can ask
    // this worker to skip its warm-up before the worker looks (a tier without warm-up jobs
    // has nothing to skip).
    let _warming = if warm_up && !tier.zygote_config.warm_up.is_empty() {
        Some(tier.warming(id, ours.as_fd())?)
    } else {
        None
    };
    let fds = [OwnedFd::from(theirs), stdout_w, stderr_w, workspace_fd];
    let forked = zygote.fork(id, warm_up, uid, fds, &workspace.path).await?;
    let pid = forked.pid;
    let channel = JobChannel::new(OwnedFd::from(ours))?;
    let mut worker = Worker::new(
        id,
        zygote.restarts,
        generation.lease(),
        forked,
        channel,
        stdout_r,
        stderr_r,
        workspace,
    )?;
    worker.watch_oom(inner.oom.clone());
    let timeout = inner.settings.spawn_timeout;
    // Forked at the zygote's priority: raised once a job waits for the tier, or a busy
    // host could hold it back at `SCHED_IDLE` (see `Tier::prioritise`).
    let ready = async {
        loop {
            let demand = tier.demand();
            tokio::pin!(demand);
            demand.as_mut().enable();
            if tier.in_demand() {
                worker.foreground();
                return worker.channel.recv().await;
            }
            tokio::select! {
                msg = worker.channel.recv() => return msg,
                () = demand => {}
            }
        }
    };
    // A worker the host starves of CPU (busy with normal-priority work while this one is
    // background work) is given more periods; a stuck one is killed after the first.
    let waited = {
        let mut ready = std::pin::pin!(ready);
        let mut periods = 0;
        // Counted from the fork: a new process starts with no CPU time, so a worker that
        // is ready in time costs no read of `/proc`.
        let mut before = Some(SchedStat::FORKED);
        loop {
            periods += 1;
            if let Ok(message) = tokio::time::timeout(timeout, ready.as_mut()).await {
                break Ok(message);
            }
            let after = SchedStat::of(pid);
            if starved(before, after, timeout) && timeout * (periods + 1) <= patience(timeout) {
                tracing::info!(tier = %tier.name, pid, waited = ?timeout * periods, "a starting worker waits for a CPU: the host is busy");
                before = after;
                continue;
            }
            let on_cpu = after.map_or(Duration::ZERO, |s| s.on_cpu);
            break Err(format!(
                "not ready after {:?} (it had {on_cpu:?} of CPU; {})",
                timeout * periods,
                waiting_in(pid)
            ));
        }
    };
    let reason = match waited {
        Ok(Ok(Some(WorkerMessage::Ready { warmed }))) => {
            worker.warmed = warmed;
            return Ok(worker);
        }
        Ok(Ok(Some(other))) => format!("sent {other:?} instead of ready"),
        Ok(Ok(None)) => {
            let status = worker.exit_status(Duration::from_secs(1)).await;
            format!("exited ({status:?}): {}", read_available(&worker.stderr))
        }
        Ok(Err(e)) => e.to_string(),
        Err(reason) => reason,
    };
    Err(SpawnError::NotReady { pid, reason })
}

/// Whether `zygote`'s workers drop to a uid of their own (else the workspace stays ours,
/// which is also the workers' uid).
fn drops_privileges(zygote: &ZygoteHandle) -> bool {
    zygote
        .info
        .sandbox
        .iter()
        .any(|r| r.layer == Layer::DropPrivileges && r.state == LayerState::Active)
}
