//! `POST /v1/admin/reload`: re-reads the configuration the service started with (the same
//! file, environment and flags) and rolls over to it. Keys a running service cannot take
//! (the listen address, `worker.*`, the file store ...) are refused with 422 naming each
//! one, and nothing changes. Packages added with `/v1/admin/packages` stay: the managed
//! environment is laid over the re-read configuration. Answers the new generation.

use axum::Json;
use axum::extract::State;

use crate::api::SharedState;
use crate::auth::AdminCaller;
use crate::error::ApiError;
use crate::generation::{GenerationInfo, NextGeneration, roll_over};

pub async fn reload(
    State(state): State<SharedState>,
    admin: AdminCaller,
) -> Result<Json<GenerationInfo>, ApiError> {
    let mut config = state
        .config()
        .reload()
        .map_err(|e| ApiError::Validation(format!("{e}; nothing changed")))?;
    // The operator's package changes live in the managed environment, not in the file:
    // the reloaded configuration runs on it too.
    state.envs.overlay(&mut config);
    tracing::info!(by = admin.who(), "reloading the configuration");
    let next = NextGeneration {
        config,
        probe_imports: Vec::new(),
        reason: "reload".into(),
    };
    match roll_over(&state, next).await {
        Ok(info) => Ok(Json(info)),
        Err(e) => Err(e.into_api()),
    }
}
