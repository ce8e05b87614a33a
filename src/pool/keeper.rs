//! Starting a tier's zygote (checking the sandbox layers it must have) and restarting it,
//! with backoff, whenever it dies. The service's first generation serves before its
//! fuller tiers are up: their keepers start them first ([`first_start`]), retrying a
//! start that fails while the other tiers serve.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use snakecage_worker::protocol::{Layer, LayerState, ZygoteInfo};

use super::events::KillReason;
use super::generation::Generation;
use super::tier::Tier;
use super::zygote::ZygoteHandle;
use super::{Inner, PoolError, PoolSettings};

/// Starts a zygote for `config`, refusing it when a required layer is not active; with
/// `background`, at idle priority for that long at most (see [`ZygoteHandle::start`]).
pub(super) async fn start_zygote(
    settings: &PoolSettings,
    config: &snakecage_worker::protocol::ZygoteConfig,
    restarts: u64,
    background: Option<Duration>,
) -> Result<Arc<ZygoteHandle>, PoolError> {
    let zygote = ZygoteHandle::start(
        &settings.worker_binary,
        config,
        restarts,
        settings.spawn_timeout * 4,
        background,
    )
    .await?;
    if let Err(e) = check_required(&zygote.info, &settings.require) {
        zygote.shutdown(Duration::from_secs(5)).await;
        return Err(PoolError::SandboxRequired(e));
    }
    Ok(zygote)
}

/// Starts a keeper for each tier's zygote of `generation`.
pub(super) fn keep_zygotes(inner: &Arc<Inner>, generation: &Arc<Generation>) {
    for index in 0..generation.tiers.len() {
        tokio::spawn(zygote_keeper(inner.clone(), generation.clone(), index));
    }
}

/// How long a tier whose zygote could not start waits before it tries again, at first
/// and at most. A preload that kills the interpreter fails every time, and each attempt
/// costs that tier's preloads in CPU; a start that timed out on a busy host, or was
/// killed for memory, may pass the next time.
const FIRST_START_RETRY: Duration = Duration::from_secs(1);
const FIRST_START_RETRY_MAX: Duration = Duration::from_secs(60);

/// Starts tier `index`'s zygote of `generation` (it has none yet) and restarts it
/// whenever it dies, with backoff, waking the refill; ends when the generation is
/// retired (its zygotes are shut down when nothing uses them) or the pool shuts down.
pub(super) async fn zygote_keeper(inner: Arc<Inner>, generation: Arc<Generation>, index: usize) {
    let tier = &generation.tiers[index];
    if tier.zygote().is_none() && !first_start(&inner, &generation, index).await {
        return;
    }
    loop {
        let Some(current) = tier.zygote() else {
            return;
        };
        tokio::select! {
            () = current.died() => {}
            () = inner.shutdown.cancelled() => return,
            () = generation.retired.cancelled() => return,
        }
        if inner.shutdown.is_cancelled() || generation.retired.is_cancelled() {
            return;
        }
        tracing::error!(tier = %tier.name, pid = current.info.pid, "the zygote died; restarting it");
        // Its idle workers died with it.
        for _ in tier.idle.drain() {
            inner.events.worker_killed(KillReason::LostIdle);
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            let started = start_zygote(
                &generation.settings,
                &tier.zygote_config,
                current.restarts + 1,
                None,
            );
            tokio::select! {
                result = started => match result {
                    Ok(zygote) => {
                        tier.replace_zygote(zygote);
                        inner.counters.spawn_succeeded();
                        inner.counters.zygote_restarts.fetch_add(1, Ordering::Relaxed);
                        inner.events.zygote_restarted();
                        inner.refill.notify_one();
                        break;
                    }
                    Err(e) => {
                        tracing::error!(tier = %tier.name, error = %e, "restarting the zygote failed; retrying");
                        let why = format!("restarting the zygote failed: {e}");
                        // The tiers that serve take its jobs meanwhile; only when none
                        // does would a waiting request wait for nothing.
                        if !generation.tiers.iter().any(Tier::serves) {
                            inner.counters.spawn_failed(why.clone());
                        }
                        tier.start_failed(why);
                    }
                },
                () = inner.shutdown.cancelled() => return,
                () = generation.retired.cancelled() => return,
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// Starts tier `index`'s first zygote, retrying with backoff while it fails: the tier is
/// `failed` with the reason meanwhile (`/health` is degraded and names it) and the tiers
/// that serve take its jobs. False when the pool shuts down or the generation is retired
/// first.
async fn first_start(inner: &Arc<Inner>, generation: &Arc<Generation>, index: usize) -> bool {
    let tier = &generation.tiers[index];
    let mut backoff = FIRST_START_RETRY;
    loop {
        let started = start_zygote(&generation.settings, &tier.zygote_config, 0, None);
        let result = tokio::select! {
            result = started => result,
            () = inner.shutdown.cancelled() => return false,
            () = generation.retired.cancelled() => return false,
        };
        match result {
            Ok(zygote) => {
                if inner.shutdown.is_cancelled() || generation.retired.is_cancelled() {
                    zygote.shutdown(Duration::from_secs(5)).await;
                    return false;
                }
                report_preload_failures(&tier.name, &zygote.info);
                tier.replace_zygote(zygote);
                tracing::info!(tier = %tier.name, "the tier's zygote is up");
                inner.refill.notify_one();
                return true;
            }
            Err(e) => {
                tracing::error!(
                    tier = %tier.name, error = %e, retry_in = ?backoff,
                    "the tier's zygote could not start; the tiers that serve take its jobs"
                );
                tier.start_failed(e.to_string());
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = inner.shutdown.cancelled() => return false,
            () = generation.retired.cancelled() => return false,
        }
        backoff = (backoff * 2).min(FIRST_START_RETRY_MAX);
    }
}

/// Logs the modules a tier's new zygote was configured to preload and could not import
/// (its jobs import them themselves, and fail where they would have).
pub(super) fn report_preload_failures(tier: &str, info: &ZygoteInfo) {
    for failure in &info.preload_failures {
        tracing::warn!(%tier, %failure, "a configured preload module is not available");
    }
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

#[cfg(test)]
mod tests {
    use snakecage_worker::protocol::LayerReport;

    use super::*;

    fn info(layers: &[(Layer, LayerState)]) -> ZygoteInfo {
        ZygoteInfo {
            pid: 1,
            python_version: "3.12.1".into(),
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
