//! A rollover on the pool's side: [`Pool::prepare`] starts the next generation beside the
//! current one (its zygotes preload and warm up, the refill stocks its tiers), probes a
//! real worker of each tier, forked for the probe ([`super::probe`]), and waits for its
//! idle workers; then [`Pool::switch`] makes it current at once and retires the old one,
//! whose zygotes are shut down when nothing uses them any more. A failure at any step
//! leaves the current generation serving as if nothing happened.
//!
//! All of it is background work: the new zygotes start, preload and warm up at
//! `SCHED_IDLE` (raised after [`ZYGOTE_PATIENCE`] if still starting), their workers are
//! forked and warmed up at `SCHED_IDLE` like every refill, and the probe job keeps that
//! priority (raised after `probe::PROBE_PATIENCE`), so live requests come first.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use snakecage_worker::protocol::ZygoteInfo;

use super::generation::Generation;
use super::tier::Tier;
use super::{Inner, Pool, PoolSettings, keeper, probe, refill};

/// Where a rollover failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloverStage {
    /// A zygote did not start (or lacks a required sandbox layer).
    Start,
    /// A zygote could not import a module its tier preloads.
    Preload,
    /// No worker of a tier came up (forked, hardened, warmed up).
    Worker,
    /// The probe job failed in a worker (an import raised, say).
    Probe,
}

impl fmt::Display for RolloverStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RolloverStage::Start => "starting its zygotes",
            RolloverStage::Preload => "preloading",
            RolloverStage::Worker => "starting a worker",
            RolloverStage::Probe => "the probe in a sandboxed worker",
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{stage}: {detail}")]
pub struct PrepareError {
    pub stage: RolloverStage,
    pub detail: String,
}

/// A generation started, stocked and probed, not serving yet: [`Pool::switch`] to it, or
/// drop it (its zygotes are shut down).
pub struct Prepared {
    generation: Option<Arc<Generation>>,
    inner: Arc<Inner>,
}

impl Prepared {
    pub fn id(&self) -> u64 {
        self.generation().id
    }

    /// What its session tier's zygote reported (Python, packages, sandbox layers).
    pub fn zygote_info(&self) -> ZygoteInfo {
        self.generation().zygote_info()
    }

    fn generation(&self) -> &Arc<Generation> {
        self.generation.as_ref().expect("a prepared generation")
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some(generation) = self.generation.take() {
            abandon(&self.inner, &generation);
            tokio::spawn(async move { generation.shut_down().await });
        }
    }
}

/// Stops stocking a generation that will not serve, and drops its idle workers.
fn abandon(inner: &Inner, generation: &Generation) {
    inner.generations.set_warming(None);
    generation.retire();
}

/// How long a new generation's zygotes start at idle priority before they are raised: live
/// requests come first, but a host too busy to leave idle time must still switch.
const ZYGOTE_PATIENCE: Duration = Duration::from_secs(10);

/// How long each step may take before the rollover gives up on it.
fn step_timeout(settings: &PoolSettings) -> Duration {
    settings.spawn_timeout * 4
}

impl Pool {
    /// Starts, stocks and probes the next generation from `settings` (its tiers, limits,
    /// sandbox; the size, queue, binary and workspace root stay the pool's).
    pub async fn prepare(
        &self,
        mut settings: PoolSettings,
        probe_imports: &[String],
        reason: &str,
    ) -> Result<Prepared, PrepareError> {
        let inner = &self.inner;
        settings.worker_binary = inner.settings.worker_binary.clone();
        settings.workspace_root = inner.settings.workspace_root.clone();
        settings.spawn_timeout = inner.settings.spawn_timeout;
        if let Some(uids) = &inner.uids {
            super::uids::probe_with(&mut settings, uids.first());
        }
        // The cgroup made at start, whatever the new configuration says of it.
        super::cgroup::plan_with(&mut settings, &inner.cgroup_plan);
        let id = inner.generations.next_id();
        tracing::info!(generation = id, %reason, "starting a new generation");
        let generation = Generation::start(settings, id, inner.settings.size, ZYGOTE_PATIENCE)
            .await
            .map_err(|e| PrepareError {
                stage: RolloverStage::Start,
                detail: e.to_string(),
            })?;
        let generation = Arc::new(generation);
        let prepared = Prepared {
            generation: Some(generation.clone()),
            inner: inner.clone(),
        };
        check_preloads(&inner.generations.current(), &generation)?;
        keeper::keep_zygotes(inner, &generation);
        inner.generations.set_warming(Some(generation.clone()));
        inner.refill.notify_one();
        let timeout = step_timeout(&inner.settings);
        // Every tier is probed, also one whose idle target is none (`tiers.min_idle = 0`
        // and no demand yet): its workers must start and import what the change names
        // before anything is routed to it.
        let probes = (0..generation.tiers.len()).map(|index| {
            let generation = &generation;
            async move {
                let tier = &generation.tiers[index];
                let worker = refill::spawn_apart(inner, generation, index, timeout)
                    .await
                    .map_err(|why| PrepareError {
                        stage: RolloverStage::Worker,
                        detail: format!("tier {}: {why}", tier.name),
                    })?;
                probe::probe(worker, probe_imports)
                    .await
                    .map_err(|detail| PrepareError {
                        stage: RolloverStage::Probe,
                        detail: format!("tier {}: {detail}", tier.name),
                    })
            }
        });
        futures_util::future::try_join_all(probes).await?;
        // Serve from warm workers from the first request on: wait for the idle targets
        // (none for a tier that keeps none).
        let stocked = async {
            while generation.tiers.iter().any(|t| t.idle.len() < t.wanted()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(timeout, stocked).await.is_err() {
            tracing::warn!(
                generation = id,
                "the new generation's tiers are not fully stocked yet; switching anyway"
            );
        }
        Ok(prepared)
    }

    /// Makes `prepared` the generation new workers come from, at once; the old one's idle
    /// workers are dropped, its running jobs and sessions go on, and its zygotes are shut
    /// down once nothing uses them.
    pub fn switch(&self, mut prepared: Prepared) {
        let Some(generation) = prepared.generation.take() else {
            return;
        };
        let inner = self.inner.clone();
        let old = inner.generations.switch(generation);
        inner.refill.notify_one();
        tracing::info!(
            old = old.id,
            new = inner.generations.current().id,
            "switched generations"
        );
        tokio::spawn(async move {
            loop {
                inner.generations.collect_garbage().await;
                if inner.generations.retired().is_empty() || inner.shutdown.is_cancelled() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                    () = inner.shutdown.cancelled() => return,
                }
            }
        });
    }
}

/// A module the new generation fails to preload where the current one did not is a
/// failure (the current one's own failures are not new).
fn check_preloads(current: &Generation, next: &Generation) -> Result<(), PrepareError> {
    let before: BTreeSet<String> = current
        .tiers
        .iter()
        .filter_map(Tier::zygote)
        .flat_map(|z| z.info.preload_failures.clone())
        .collect();
    let new: Vec<String> = next
        .tiers
        .iter()
        .flat_map(|t| {
            let name = t.name.clone();
            let failures = t.zygote().map(|z| z.info.preload_failures.clone());
            failures
                .unwrap_or_default()
                .into_iter()
                .map(move |f| (name.clone(), f))
        })
        .filter(|(_, f)| !before.contains(f))
        .map(|(tier, f)| format!("tier {tier}: {f}"))
        .collect();
    if new.is_empty() {
        Ok(())
    } else {
        Err(PrepareError {
            stage: RolloverStage::Preload,
            detail: new.join("; "),
        })
    }
}
