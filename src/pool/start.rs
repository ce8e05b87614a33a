//! Starting the pool: every tier's zygote starts at once, the lightest is awaited (it
//! preloads least, so it is up first, and alone lists the installed packages), the fuller
//! ones come up in the background and serve from their first worker on (`keeper`); the
//! refill task and the sessions' CPU-time watchdog start with them.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::events::{NoEvents, PoolEvents};
use super::generation::{Generation, Generations};
use super::root::WorkspaceRoot;
use super::slots::Slots;
use super::status::PoolCounters;
use super::uids::{self, UidRange, WorkerUids};
use super::{Inner, Pool, PoolError, PoolSettings, cgroup, keeper, refill};

/// The worker uids, claimed where workers will drop to them: the service runs as root and
/// `drop_privileges` is not switched off.
async fn claim_uids(settings: &PoolSettings) -> Result<Option<Arc<WorkerUids>>, PoolError> {
    let drops = nix::unistd::geteuid().is_root()
        && settings
            .tiers
            .iter()
            .any(|t| (t.zygote.sandbox).wants(snakecage_worker::protocol::Layer::DropPrivileges));
    if !drops {
        return Ok(None);
    }
    let u = &settings.uids;
    let mut range = UidRange::claim(u.first, u.count, &u.lock_file).map_err(PoolError::Uids)?;
    if !range.passed_over.is_empty() {
        tracing::info!(
            processes = %uids::Occupant::describe_all(&range.passed_over),
            "worker uids: blocks under whose ids processes run were passed over (a killed instance's workers, not yet gone, or another program's)"
        );
    }
    if !range.occupants.is_empty() {
        tracing::warn!(
            first = range.first,
            last = range.last(),
            processes = %uids::Occupant::describe_all(&range.occupants),
            "worker uids: processes run under ids of the configured range; waiting for them to go (a killed instance's workers, most likely)"
        );
        let waited = range
            .vacated(uids::VACATE_PATIENCE, &uids::occupants_of)
            .await
            .map_err(PoolError::Uids)?;
        tracing::info!(
            waited_ms = waited.as_millis() as u64,
            "worker uids: no process runs under the configured range any more"
        );
    }
    tracing::info!(
        first = range.first,
        last = range.last(),
        "worker uids claimed: each worker runs under one of its own"
    );
    if !range.skipped.is_empty() {
        tracing::info!(
            skipped = %super::uid_accounts::describe(&range.skipped),
            "worker uids: ids of the system's accounts were passed over, no worker runs as one"
        );
    }
    Ok(Some(WorkerUids::new(range)))
}

impl Pool {
    /// Starts every tier's zygote, the refill and the restart tasks; returns once the
    /// lightest tier's zygote is up (the others come up in the background: see the
    /// module docs), or with why it could not start.
    pub async fn start(settings: PoolSettings) -> Result<Self, PoolError> {
        Self::start_observed(settings, Arc::new(NoEvents)).await
    }

    /// [`Pool::start`], reporting queue waits, spawns, kills and restarts to `events`.
    pub async fn start_observed(
        mut settings: PoolSettings,
        events: Arc<dyn PoolEvents>,
    ) -> Result<Self, PoolError> {
        let root =
            WorkspaceRoot::claim(&settings.workspace_root, &settings.bound).map_err(|source| {
                PoolError::WorkspaceRoot {
                    path: settings.workspace_root.clone(),
                    source,
                }
            })?;
        settings.workspace_root = root.workspaces();
        let uids = claim_uids(&settings).await?;
        if let Some(uids) = &uids {
            uids::probe_with(&mut settings, uids.first());
        }
        let (cgroup, cgroup_plan) = cgroup::set_up(&settings.cgroup, &cgroup::Place::here());
        if let (
            cgroup::MemoryBound::Bytes(bytes),
            snakecage_worker::protocol::CgroupPlan::Unavailable(why),
        ) = (settings.cgroup.memory, &cgroup_plan)
        {
            return Err(PoolError::SandboxRequired(format!(
                "limits.max_total_memory_mb = {} bounds the workers' memory in the instance's cgroup, which could not be made: {why}; leave it unset (or 0) to run without that bound",
                bytes >> 20
            )));
        }
        cgroup::plan_with(&mut settings, &cgroup_plan);
        let oom = cgroup.as_ref().and_then(cgroup::InstanceCgroup::oom_watch);
        // Workspace files workers write are tmpfs memory, charged to the same bound: with
        // the workspaces' bound the larger, a job filling them takes the workers past the
        // memory bound before it gets ENOSPC, and the kernel kills workers for it.
        if let (Some(watch), Ok(usage)) = (&oom, root.usage())
            && usage.size_bytes > watch.bytes()
        {
            tracing::warn!(
                workspace_mb = usage.size_bytes >> 20,
                memory_mb = watch.bytes() >> 20,
                "the workspaces' file system is larger than limits.max_total_memory_mb, which the files workers write count against: a job filling the workspaces can take the workers together past the memory bound before its writes fail with ENOSPC, and the kernel then kills workers, the largest first (other tenants' sessions among them); lower workspace.size_mb or raise the memory bound"
            );
        }
        let first = Arc::new(Generation::starting(settings.clone(), 1, settings.size));
        let shutdown = CancellationToken::new();
        let inner = Arc::new(Inner {
            generations: Generations::new(first.clone()),
            slots: Slots::new(
                settings.size,
                settings.queue_length,
                settings.queue_timeout,
                shutdown.clone(),
            ),
            settings,
            root,
            next_worker_id: AtomicU64::new(1),
            refill: Notify::new(),
            stocking: std::sync::Mutex::new(()),
            shutdown,
            counters: PoolCounters::default(),
            events,
            watchdog: Arc::default(),
            uids,
            cgroup: std::sync::Mutex::new(cgroup),
            cgroup_plan,
            oom,
        });
        let pool = Self {
            inner: inner.clone(),
        };
        // A start given up (the future dropped: a shutdown asked for while starting) stops
        // the tasks below, which then drop their zygotes and the workspace root.
        let given_up = inner.shutdown.clone().drop_guard();
        tokio::spawn(refill::refill_loop(inner.clone()));
        tokio::spawn(inner.watchdog.clone().run(inner.shutdown.clone()));
        // The fuller tiers start in the background while the lightest is awaited here.
        for index in 1..first.tiers.len() {
            tokio::spawn(keeper::zygote_keeper(inner.clone(), first.clone(), index));
        }
        let lightest = &first.tiers[0];
        match keeper::start_zygote(&inner.settings, &lightest.zygote_config, 0, None).await {
            Ok(zygote) => {
                keeper::report_preload_failures(&lightest.name, &zygote.info);
                lightest.replace_zygote(zygote);
            }
            Err(e) => {
                pool.shutdown().await;
                return Err(e);
            }
        }
        given_up.disarm();
        tokio::spawn(keeper::zygote_keeper(inner.clone(), first, 0));
        inner.refill.notify_one();
        Ok(pool)
    }
}
