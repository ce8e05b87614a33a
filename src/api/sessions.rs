//! `/v1/sessions`: create (Onyx's shape), list, inspect, reset, delete. Runs are in
//! `session_run`; the registry and its rules live in `crate::sessions`.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use snakecage_worker::protocol::Variable;

use super::SharedState;
use super::execute::{self, FileInput, stage_inputs};
use super::json::{bytes_rejection, parse_object};
use super::session_run::{CONTROL_TIMEOUT, ensure_worker, lose};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::files::workspace::{self};
use crate::sessions::SessionInfo;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    #[serde(default, deserialize_with = "super::nullable::or_default")]
    pub files: Vec<FileInput>,
    #[serde(default, deserialize_with = "super::whole_number::optional")]
    pub ttl_seconds: Option<u64>,
    /// Keep the successful runs (and their tool calls' answers) and replay them on a new
    /// worker if the worker is lost.
    #[serde(default, deserialize_with = "super::nullable::or_default")]
    pub replay: bool,
}

impl super::json::JsonObject for CreateSessionRequest {
    const SKETCH: &'static str = r#"{"ttl_seconds": ..., "files": [...]}, or no body"#;
}

#[derive(Debug, Serialize)]
pub struct CreatedSession {
    pub session_id: String,
    pub created_at: String,
    pub expires_at: String,
    pub replay: bool,
}

#[derive(Debug, Serialize)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub info: SessionInfo,
    /// `null` while a run is in progress (`status: busy`): its worker is running it; and
    /// while a replay session waits for its next run to rebuild it (`replay_pending`).
    pub variables: Option<Vec<Variable>>,
    /// How many user globals there are: more than `variables` lists when past the
    /// listing's bounds (500 entries, 50,000 characters). `null` with `variables`.
    pub variables_total: Option<usize>,
}

pub async fn create(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<CreatedSession>), ApiError> {
    let body = body.map_err(|rejection| bytes_rejection(&rejection, &state))?;
    // An empty body is a session with the defaults.
    let req: CreateSessionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSessionRequest {
            files: Vec::new(),
            ttl_seconds: None,
            replay: false,
        }
    } else {
        parse_object(&body, &state)?
    };
    let sessions = &state.sessions;
    let ttl = match req.ttl_seconds {
        None => None,
        Some(0) => {
            return Err(ApiError::Validation(
                "ttl_seconds must be greater than 0".into(),
            ));
        }
        Some(s) if Duration::from_secs(s) > sessions.settings().max_ttl => {
            return Err(ApiError::Validation(format!(
                "ttl_seconds exceeds maximum of {} seconds",
                sessions.settings().max_ttl.as_secs()
            )));
        }
        Some(s) => Some(Duration::from_secs(s)),
    };
    let inputs = stage_inputs(&req.files)?;
    execute::check_file_ids(&state, &caller, &inputs).await?;
    let store = state.store.clone();
    let owner = caller.owner();
    let journaled = req.replay.then(|| inputs.clone());
    let session = sessions
        .create(
            owner,
            caller.max_sessions(),
            ttl,
            journaled.as_deref(),
            async move |path: &std::path::Path| {
                Ok::<_, ApiError>(workspace::stage(store.as_ref(), owner, path, &inputs).await?)
            },
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedSession {
            session_id: session.id.clone(),
            created_at: session.info().created_at,
            expires_at: session.expires_at(),
            replay: session.replay,
        }),
    ))
}

pub async fn list(State(state): State<SharedState>, caller: Caller) -> Json<Value> {
    Json(json!({ "sessions": state.sessions.list(caller.owner()) }))
}

pub async fn get(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionDetail>, ApiError> {
    let session = state.sessions.get(&id, caller.owner())?;
    let Some(mut guard) = session.read().await? else {
        // A run holds the session: its worker is busy with it and cannot list the globals,
        // but what the session is and that it is busy can still be said.
        return Ok(Json(SessionDetail {
            info: session.info(),
            variables: None,
            variables_total: None,
        }));
    };
    let grace = state.sessions.settings().interrupt_grace;
    // A replay session whose worker was lost has no variables to list until its next run
    // rebuilds it (`status: replay_pending`), which will restore them: they are unknown
    // (null), not none, and listing them is no reason to replay.
    let pending = guard.lost.is_some();
    let held = &mut *guard;
    let listed = match held.worker.as_mut() {
        None if pending => None,
        None => return Err(super::session_run::gone(&id)),
        Some(worker) => match worker.variables(CONTROL_TIMEOUT, grace).await {
            Ok(listed) => Some(listed),
            Err(e) if held.mark_lost(e.to_string()) => None,
            Err(e) => return Err(lose(&state, &session, held, e.to_string())),
        },
    };
    drop(guard);
    let (variables, variables_total) = match listed {
        Some(listed) => (Some(listed.variables), Some(listed.total)),
        None => (None, None),
    };
    Ok(Json(SessionDetail {
        info: session.info(),
        variables,
        variables_total,
    }))
}

pub async fn reset(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    let session = state.sessions.get(&id, caller.owner())?;
    let mut guard = session.lock().await?;
    let grace = state.sessions.settings().interrupt_grace;
    // A lost replay session is rebuilt first: files its runs wrote outlive a reset.
    ensure_worker(&state, caller.owner(), &session, &mut guard).await?;
    let worker = guard
        .worker
        .as_mut()
        .ok_or_else(|| super::session_run::gone(&id))?;
    match worker.reset(CONTROL_TIMEOUT, grace).await {
        Ok(()) => {
            if let Some(journal) = guard.journal.as_mut() {
                journal.reset();
            }
            session.touch(false);
            drop(guard);
            Ok(Json(session.info()))
        }
        Err(e) => Err(lose(&state, &session, &mut guard, e.to_string())),
    }
}

pub async fn delete(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.sessions.delete(&id, caller.owner())?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn bash(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiError {
    // Another tenant's session id is unknown here too.
    if let Err(e) = state.sessions.get(&id, caller.owner()) {
        return e.into();
    }
    ApiError::NotImplemented(
        "bash is not available: this sandbox runs Python in a worker that cannot spawn processes \
         (process creation is denied), so there is no shell. Run Python with \
         POST /v1/sessions/{id}/execute instead."
            .into(),
    )
}
