//! `POST /v1/admin/reload`: re-reads the configuration the service started with (the same
//! file, environment and flags) and rolls over to it. Keys a running service cannot take
//! (the listen address, `worker.*`, the file store ...) are refused with 422 naming each
//! one, and nothing changes. Packages added with `/v1/admin/packages` stay: the managed
//! environment is laid over the re-read configuration. When the configuration and the
//! environment's files are as the serving generation has them, nothing is started
//! (`"rolled_over": false`) unless `?force=true` (or a JSON body `{"force": true}`; both,
//! differing, are refused). The API keys are re-read too, from the keys file
//! (`auth.keys_file`) and inline (`[[auth.keys]]` of the configuration file): the new set
//! is in force, whole, from the end of the reload (a change of keys alone starts no
//! generation), and keys that do not parse or check, a keys file that holds no key or a
//! configuration left without any key are refused with 422 (the keys in force stay).
//! Answers the generation serving after it. SIGHUP runs the same reload
//! ([`crate::hangup`]).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};

use crate::api::json::{JsonObject, bytes_rejection, parse_object};
use crate::api::{AppState, SharedState};
use crate::auth::{AdminCaller, KeysChange};
use crate::config::AuthConfig;
use crate::error::ApiError;
use crate::generation::{GenerationInfo, NextGeneration, Outcome, RolloverError, roll_over_in};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadQuery {
    /// Start a new generation even when nothing changed.
    #[serde(default)]
    force: Option<bool>,
}

/// The same setting as a JSON body, for clients that send their options there. An empty
/// body is no setting.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadBody {
    #[serde(default)]
    force: Option<bool>,
}

impl JsonObject for ReloadBody {
    const SKETCH: &'static str = r#"{"force": true}"#;
}

/// The generation serving after the reload, whether the reload started it, and what it
/// changed in the API keys (when the service has keys).
#[derive(Debug, Serialize)]
pub struct ReloadAnswer {
    #[serde(flatten)]
    pub generation: GenerationInfo,
    pub rolled_over: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the keys were re-read from, and the key names added, removed and changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeysChange>,
    /// The file's settings that an environment variable or a flag overrides: an edit of
    /// them in the file is not applied.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overridden: Vec<String>,
}

pub async fn reload(
    State(state): State<SharedState>,
    admin: AdminCaller,
    query: Result<Query<ReloadQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ReloadAnswer>, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; the only query parameter is `force` (true or false)",
            e.body_text()
        ))
    })?;
    let body = body.map_err(|rejection| bytes_rejection(&rejection, &state))?;
    let in_body = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        parse_object::<ReloadBody>(&body, &state)?.force
    };
    let force = match (query.force, in_body) {
        (Some(q), Some(b)) if q != b => {
            return Err(ApiError::BadRequest(format!(
                "`force` is given twice and differs: ?force={q} in the query, \"force\": {b} \
                 in the body; give it once"
            )));
        }
        (q, b) => q.or(b).unwrap_or(false),
    };
    let by = admin.who().to_owned();
    super::to_completion(async move { reload_service(&state, force, &by).await })
        .await
        .map(Json)
}

/// The reload itself, for `POST /v1/admin/reload` and SIGHUP alike (`by` says who asked,
/// for the logs): the configuration and the API keys re-read, checked, rolled over to.
/// The new keys are put in force only once the rollover has gone through (or found
/// nothing else to change): a refused or failed reload changes nothing at all.
pub(crate) async fn reload_service(
    state: &AppState,
    force: bool,
    by: &str,
) -> Result<ReloadAnswer, ApiError> {
    let mut config = state
        .config()
        .reload()
        .map_err(|e| ApiError::Validation(format!("{e}; nothing changed")))?;
    let overridden = crate::config::shadowed_settings(&config);
    for setting in &overridden {
        tracing::warn!(by, setting = %setting, "reload: a setting of the file is overridden");
    }
    // The operator's package changes live in the managed environment, not in the file:
    // the reloaded configuration runs on it too.
    state.envs.overlay(&mut config);
    // Held from the keys' read to their being in force, so that two reloads cannot
    // interleave them.
    let slot = state
        .rollovers
        .reserve("reload")
        .map_err(RolloverError::into_api)?;
    tracing::info!(by, force, "reloading the configuration");
    // The re-read configuration's inline keys, and the keys file the service runs with:
    // its path, like the rest of `auth.*`, changes only with a restart (the rollover
    // below refuses a new one, naming it).
    let auth = AuthConfig {
        keys: config.auth.keys.clone(),
        ..state.config().auth.clone()
    };
    let keys = state.keys.reread(&auth, config.source.file.as_deref()).map_err(|e| {
        ApiError::Validation(format!(
            "{e}; nothing changed: the API keys in force stay, and no new generation was started"
        ))
    })?;
    let next = NextGeneration {
        config,
        probe_imports: Vec::new(),
        reason: "reload".into(),
        force,
    };
    let outcome = roll_over_in(state, &slot, next)
        .await
        .map_err(RolloverError::into_api)?;
    let keys = keys.map(|(keys, change)| {
        if !change.is_empty() {
            for warning in keys.sessions_above_global(state.sessions.settings().max_sessions) {
                tracing::warn!(by, "{warning}");
            }
            state.metrics.set_tenants(keys.names());
            state.keys.store(keys);
            tracing::info!(
                by,
                from = %change.source(),
                keys = %change.summary(),
                "API keys re-read"
            );
        }
        change
    });
    drop(slot);
    let not_applied = (!overridden.is_empty()).then(|| {
        format!(
            "Not applied: {} (the environment and flags win over the file; change them and \
             restart)",
            overridden.join("; ")
        )
    });
    Ok(match outcome {
        Outcome::RolledOver(generation) => ReloadAnswer {
            generation,
            rolled_over: true,
            message: not_applied,
            keys,
            overridden,
        },
        Outcome::Unchanged(generation) => {
            let unchanged = format!(
                "the configuration and the environment's files are those generation {} runs \
                 with; no new generation was started (?force=true starts one anyway)",
                generation.id
            );
            let message = match &keys {
                Some(change) if !change.is_empty() => format!(
                    "API keys re-read from {}: {}. Nothing else changed: {unchanged}",
                    change.source(),
                    change.summary(),
                ),
                _ => format!("nothing changed: {unchanged}"),
            };
            let message = match not_applied {
                Some(not_applied) => format!("{message}. {not_applied}"),
                None => message,
            };
            ReloadAnswer {
                message: Some(message),
                generation,
                rolled_over: false,
                keys,
                overridden,
            }
        }
    })
}
