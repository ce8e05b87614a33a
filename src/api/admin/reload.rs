//! `POST /v1/admin/reload`: re-reads the configuration the service started with (the same
//! file, environment and flags) and rolls over to it. Keys a running service cannot take
//! (the listen address, `worker.*`, the file store ...) are refused with 422 naming each
//! one, and nothing changes. Packages added with `/v1/admin/packages` stay: the managed
//! environment is laid over the re-read configuration. When the configuration and the
//! environment's files are as the serving generation has them, nothing is started
//! (`"rolled_over": false`) unless `?force=true`. Answers the generation serving after it.

use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};

use crate::api::SharedState;
use crate::auth::AdminCaller;
use crate::error::ApiError;
use crate::generation::{GenerationInfo, NextGeneration, Outcome, roll_over};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadQuery {
    /// Start a new generation even when nothing changed.
    #[serde(default)]
    force: bool,
}

/// The generation serving after the reload, and whether the reload started it.
#[derive(Debug, Serialize)]
pub struct ReloadAnswer {
    #[serde(flatten)]
    generation: GenerationInfo,
    rolled_over: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

pub async fn reload(
    State(state): State<SharedState>,
    admin: AdminCaller,
    query: Result<Query<ReloadQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ReloadAnswer>, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; the only query parameter is `force` (true or false)",
            e.body_text()
        ))
    })?;
    let mut config = state
        .config()
        .reload()
        .map_err(|e| ApiError::Validation(format!("{e}; nothing changed")))?;
    // The operator's package changes live in the managed environment, not in the file:
    // the reloaded configuration runs on it too.
    state.envs.overlay(&mut config);
    tracing::info!(
        by = admin.who(),
        force = query.force,
        "reloading the configuration"
    );
    let next = NextGeneration {
        config,
        probe_imports: Vec::new(),
        reason: "reload".into(),
        force: query.force,
    };
    match roll_over(&state, next).await {
        Ok(Outcome::RolledOver(generation)) => Ok(Json(ReloadAnswer {
            generation,
            rolled_over: true,
            message: None,
        })),
        Ok(Outcome::Unchanged(generation)) => Ok(Json(ReloadAnswer {
            message: Some(format!(
                "nothing changed: the configuration and the environment's files are those \
                 generation {} runs with; no new generation was started (?force=true starts \
                 one anyway)",
                generation.id
            )),
            generation,
            rolled_over: false,
        })),
        Err(e) => Err(e.into_api()),
    }
}
