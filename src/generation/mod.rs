//! Generations and zero-downtime rollover: a zygote generation is (environment,
//! configuration, allowlist), and nothing is ever modified under a running zygote.
//!
//! [`roll_over`] starts a new zygote per tier from the next generation's configuration,
//! lets each preload and warm up, probes it (a real worker of each tier must come up with
//! every required sandbox layer, and each module in `probe_imports` must import in a
//! sandboxed probe job), and only then switches the pool and the live state
//! ([`crate::live`]) to it at once. Idle workers of the old generation are retired,
//! running jobs finish, sessions keep their worker until they end, and the old zygotes are
//! shut down once nothing uses them. If anything fails nothing switches: the old generation
//! keeps serving and the caller gets the real error. One rollover at a time.
//!
//! A rollover to what is already serving starts nothing: when the next configuration is
//! the current one (every key, compared as data) and the files of its environment are
//! those the current generation started on ([`stamp`]), the answer is
//! [`Outcome::Unchanged`] at once, with no new zygote, no metric and no id used, unless
//! the caller forces it. Generation ids count the generations that served: a failed
//! attempt leaves no gap.
//!
//! Callers: `POST /v1/admin/reload` (the configuration re-read) and the package admin,
//! which takes the rollover's slot ([`Rollovers::reserve`]) before its install, so that
//! of two changes the one that came first runs and the other gets the 409.

pub mod stamp;

use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use serde::Serialize;

use crate::api::AppState;
use crate::config::{Config, same_settings, unreloadable_changes};
use crate::error::ApiError;
use crate::live::Live;
use crate::packages::Packages;
use crate::pool::RolloverStage;
use crate::tools::ToolContext;

use self::stamp::EnvStamp;

/// What the next generation runs with.
pub struct NextGeneration {
    /// The whole configuration the new generation runs with (python.venv /
    /// python.site_packages, sandbox.allowed_packages, tiers, limits ...): a modified clone
    /// of `state.config()`.
    pub config: Config,
    /// Modules that must import in a probe worker before the switch (e.g. added packages).
    pub probe_imports: Vec<String>,
    /// Why, for /health, logs and metrics: "reload", "packages: add tabulate".
    pub reason: String,
    /// Roll over even when nothing changed (a file the environment stamp cannot see).
    pub force: bool,
}

/// How a rollover ended when it did not fail.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A new generation serves.
    RolledOver(GenerationInfo),
    /// Nothing changed: the current generation keeps serving, nothing was started.
    Unchanged(GenerationInfo),
}

impl Outcome {
    /// The generation serving now.
    pub fn generation(&self) -> &GenerationInfo {
        match self {
            Outcome::RolledOver(info) | Outcome::Unchanged(info) => info,
        }
    }

    pub fn rolled_over(&self) -> bool {
        matches!(self, Outcome::RolledOver(_))
    }
}

/// One generation as `/health`, the status page and the admin API report it.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationInfo {
    /// 1 for the generation the service started with, then one more per rollover that
    /// switched (a failed attempt leaves no gap).
    pub id: u64,
    pub reason: String,
    /// When its rollover began (when the service started, for the first).
    #[serde(serialize_with = "rfc3339")]
    pub started_at: SystemTime,
    /// How long it took to start, warm up and probe before it served.
    pub took_ms: u64,
    /// The generation it replaced.
    pub previous: Option<u64>,
    /// The modules its probe imported in a sandboxed worker.
    pub probe_imports: Vec<String>,
}

impl GenerationInfo {
    /// The generation the service started with.
    pub fn first(id: u64, took_ms: u64) -> Self {
        Self {
            id,
            reason: "start".into(),
            started_at: SystemTime::now(),
            took_ms,
            previous: None,
            probe_imports: Vec::new(),
        }
    }
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

#[derive(Debug, thiserror::Error)]
pub enum RolloverError {
    /// Another rollover is in progress (409).
    #[error("a rollover is already in progress ({reason}); retry when it has finished")]
    Busy { reason: String },
    /// The next configuration cannot be used (422); nothing was started.
    #[error("{0}")]
    Invalid(String),
    /// The new generation did not start or failed its probe; nothing switched (422).
    #[error(
        "the new generation failed ({stage}): {detail}. Nothing changed: generation {serving} keeps serving"
    )]
    Failed {
        stage: RolloverStage,
        detail: String,
        serving: u64,
    },
    #[error("the service is shutting down")]
    ShuttingDown,
}

impl RolloverError {
    pub fn into_api(self) -> ApiError {
        match self {
            e @ RolloverError::Busy { .. } => ApiError::RolloverBusy(e.to_string()),
            RolloverError::Invalid(detail) => ApiError::Validation(detail),
            e @ RolloverError::Failed { .. } => ApiError::RolloverFailed(e.to_string()),
            e @ RolloverError::ShuttingDown => ApiError::Unavailable(e.to_string()),
        }
    }

    /// The outcome label of the rollover metric.
    fn outcome(&self) -> Option<&'static str> {
        match self {
            RolloverError::Busy { .. } => None,
            _ => Some("failed"),
        }
    }
}

/// Whether a rollover is running, and why (for the 409 of a second one).
#[derive(Debug, Default)]
pub struct Rollovers {
    running: Mutex<Option<String>>,
}

/// The one rollover slot, held from the start of the work that leads to a rollover (a
/// package change's install) to the rollover's end; freed when dropped, however it ends.
pub struct RolloverSlot<'a>(&'a Rollovers);

impl Drop for RolloverSlot<'_> {
    fn drop(&mut self) {
        *self.0.running.lock().expect("rollover lock") = None;
    }
}

impl Rollovers {
    /// Takes the slot for `reason`, or answers at once who holds it.
    pub fn reserve(&self, reason: &str) -> Result<RolloverSlot<'_>, RolloverError> {
        let mut running = self.running.lock().expect("rollover lock");
        if let Some(reason) = running.as_ref() {
            return Err(RolloverError::Busy {
                reason: reason.clone(),
            });
        }
        *running = Some(reason.to_owned());
        Ok(RolloverSlot(self))
    }
}

/// Rolls the service over to `next`: see the module docs. Answers the generation serving
/// afterwards.
pub async fn roll_over(state: &AppState, next: NextGeneration) -> Result<Outcome, RolloverError> {
    let slot = state.rollovers.reserve(&next.reason)?;
    roll_over_in(state, &slot, next).await
}

/// [`roll_over`] in a slot the caller took earlier (it holds it for work before the
/// rollover, and frees it after).
pub async fn roll_over_in(
    state: &AppState,
    slot: &RolloverSlot<'_>,
    next: NextGeneration,
) -> Result<Outcome, RolloverError> {
    debug_assert!(
        std::ptr::eq(slot.0, &state.rollovers),
        "another service's slot"
    );
    let started = Instant::now();
    let result = attempt(state, next, started).await;
    let elapsed = started.elapsed();
    match &result {
        Ok(Outcome::Unchanged(info)) => {
            tracing::info!(
                generation = info.id,
                "nothing changed: no new generation started"
            );
        }
        Ok(Outcome::RolledOver(info)) => {
            state
                .metrics
                .rollover_finished("succeeded", elapsed, info.id);
            tracing::info!(generation = info.id, reason = %info.reason, took_ms = info.took_ms, "rolled over to a new generation");
        }
        Err(e) => {
            if let Some(outcome) = e.outcome() {
                state
                    .metrics
                    .rollover_finished(outcome, elapsed, state.pool.generation());
            }
            tracing::warn!(error = %e, "rollover failed; the current generation keeps serving");
        }
    }
    result
}

async fn attempt(
    state: &AppState,
    next: NextGeneration,
    started: Instant,
) -> Result<Outcome, RolloverError> {
    let began_at = SystemTime::now();
    if state.stopping.is_cancelled() {
        return Err(RolloverError::ShuttingDown);
    }
    let current = state.live.load();
    next.config
        .validate()
        .map_err(|e| RolloverError::Invalid(e.to_string()))?;
    let fixed = unreloadable_changes(&current.config, &next.config);
    if !fixed.is_empty() {
        return Err(RolloverError::Invalid(format!(
            "these keys cannot change without a restart: {}; nothing changed",
            fixed.join(", ")
        )));
    }
    let settings = crate::server::pool_settings(&next.config)
        .map_err(|e| RolloverError::Invalid(e.to_string()))?;
    let environment = EnvStamp::read_off_thread(&next.config).await;
    if !next.force
        && environment.is_some()
        && environment == current.environment
        && same_settings(&current.config, &next.config)
    {
        return Ok(Outcome::Unchanged(current.generation.clone()));
    }
    let serving = state.pool.generation();
    let prepared = state
        .pool
        .prepare(settings, &next.probe_imports, &next.reason)
        .await
        .map_err(|e| RolloverError::Failed {
            stage: e.stage,
            detail: e.detail,
            serving,
        })?;
    let info = prepared.zygote_info().clone();
    let packages = Packages::new(&info);
    let tool_context = ToolContext::new(
        &next.config,
        info.python_version.clone(),
        packages.installed(),
    );
    let generation = GenerationInfo {
        id: prepared.id(),
        reason: next.reason,
        started_at: began_at,
        took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        previous: Some(serving),
        probe_imports: next.probe_imports,
    };
    let live = Live {
        config: std::sync::Arc::new(next.config),
        packages: std::sync::Arc::new(packages),
        tool_context: std::sync::Arc::new(tool_context),
        generation: generation.clone(),
        environment,
    };
    // The pool and the live view switch together: no await in between.
    state.pool.switch(prepared);
    state.live.store(live);
    state
        .metrics
        .set_build_info(crate::server::build_info(&info));
    state.metrics.set_tiers(&state.pool.tier_names());
    Ok(Outcome::RolledOver(generation))
}
