//! `/v1/sessions`: create (Onyx's shape), list, inspect, run (JSON or SSE), reset, delete.
//! The registry and its rules live in `crate::sessions`; these are the handlers.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use snakecage_worker::protocol::Variable;
use tokio::sync::{OwnedMutexGuard, mpsc};
use tokio_util::sync::CancellationToken;

use super::SharedState;
use super::execute::{
    self, ExecuteRequest, ExecuteResponse, FileInput, Prepared, collect_limits, stage_inputs,
};
use super::json::ApiJson;
use super::stream::{self, OnDisconnect};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::files::workspace::{self};
use crate::metrics::labels::{Kind, Outcome};
use crate::pool::run::{Interrupt, OutputChunk, RunError};
use crate::sessions::{Session, SessionError, SessionInfo, SessionState};

/// How long listing variables or resetting may take before the worker is interrupted.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    #[serde(default)]
    pub files: Vec<FileInput>,
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct CreatedSession {
    pub session_id: String,
    pub created_at: String,
    pub expires_at: String,
}

#[derive(Debug, Serialize)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub info: SessionInfo,
    pub variables: Vec<Variable>,
}

pub async fn create(
    State(state): State<SharedState>,
    caller: Caller,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<CreatedSession>), ApiError> {
    // An empty body is a session with the defaults.
    let req: CreateSessionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSessionRequest {
            files: Vec::new(),
            ttl_seconds: None,
        }
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::Validation(format!("invalid request body: {e}")))?
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
    let session = sessions
        .create(
            owner,
            caller.max_sessions(),
            ttl,
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
    let mut guard = session.lock()?;
    let grace = state.sessions.settings().interrupt_grace;
    let worker = guard.worker.as_mut().ok_or_else(|| gone(&id))?;
    match worker.variables(CONTROL_TIMEOUT, grace).await {
        Ok(variables) => {
            drop(guard);
            Ok(Json(SessionDetail {
                info: session.info(),
                variables,
            }))
        }
        Err(e) => Err(lose(&state, &session, &mut guard, e.to_string())),
    }
}

pub async fn reset(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    let session = state.sessions.get(&id, caller.owner())?;
    let mut guard = session.lock()?;
    let grace = state.sessions.settings().interrupt_grace;
    let worker = guard.worker.as_mut().ok_or_else(|| gone(&id))?;
    match worker.reset(CONTROL_TIMEOUT, grace).await {
        Ok(()) => {
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

pub async fn execute(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Json<ExecuteResponse>, ApiError> {
    let mut prepared = execute::prepare(&state, &caller, req).await?;
    let _run = super::runs::attach_tools(&state, &caller, &mut prepared, None)?;
    let session = state.sessions.get(&id, caller.owner())?;
    let guard = session.lock()?;
    let _slot = caller.execution_slot()?;
    let response = run(
        state,
        caller,
        session,
        guard,
        prepared,
        None,
        CancellationToken::new(),
    )
    .await?;
    Ok(Json(response))
}

pub async fn execute_stream(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Response, ApiError> {
    // Everything that can be answered with a status is answered before the stream starts.
    let mut prepared = execute::prepare(&state, &caller, req).await?;
    let (calls_tx, calls_rx) = mpsc::channel(super::runs::TOOL_CALL_BUFFER);
    let handle = super::runs::attach_tools(&state, &caller, &mut prepared, Some(calls_tx))?;
    let run_id = handle.entry.id.clone();
    let session = state.sessions.get(&id, caller.owner())?;
    let guard = session.lock()?;
    let slot = caller.execution_slot()?;
    let (tx, rx) = mpsc::channel(stream::CHUNK_BUFFER);
    let interrupt = CancellationToken::new();
    let run = run(
        state,
        caller,
        session,
        guard,
        prepared,
        Some(tx),
        interrupt.clone(),
    );
    let run = async move {
        let _slot = slot;
        let _run = handle;
        run.await
    };
    let mut response =
        stream::sse_with_tool_calls(rx, Some(calls_rx), run, OnDisconnect::Interrupt, interrupt)
            .into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(&run_id) {
        response.headers_mut().insert(execute::RUN_ID_HEADER, value);
    }
    Ok(response)
}

/// One job in a session: stage the request's files (replacing files of the same name),
/// take an execution slot, run, report new and changed files. A worker lost on the way
/// marks the session dead (410 from then on).
async fn run(
    state: SharedState,
    caller: Caller,
    session: Arc<Session>,
    guard: OwnedMutexGuard<SessionState>,
    prepared: Prepared,
    chunks: Option<mpsc::Sender<OutputChunk>>,
    interrupt: CancellationToken,
) -> Result<ExecuteResponse, ApiError> {
    let started = std::time::Instant::now();
    let metrics = state.metrics.clone();
    let tenant = caller.owner().map(str::to_owned);
    let result = run_in(state, caller, session, guard, prepared, chunks, interrupt).await;
    let outcome = match &result {
        Ok(response) => Some(Outcome::from(response.verdict)),
        Err(e) => e.is_shed().then_some(Outcome::Rejected),
    };
    if let Some(outcome) = outcome {
        metrics.execution_finished(Kind::Session, outcome, started.elapsed(), None);
    }
    if let (Ok(_), Some(tenant)) = (&result, tenant) {
        metrics.tenant_execution(&tenant, Kind::Session);
    }
    result
}

async fn run_in(
    state: SharedState,
    caller: Caller,
    session: Arc<Session>,
    mut guard: OwnedMutexGuard<SessionState>,
    prepared: Prepared,
    chunks: Option<mpsc::Sender<OutputChunk>>,
    interrupt: CancellationToken,
) -> Result<ExecuteResponse, ApiError> {
    let Prepared {
        limits,
        inputs,
        job,
        ..
    } = prepared;
    let id = session.id.clone();
    let grace = state.sessions.settings().interrupt_grace;
    let ws = match guard.worker.as_ref() {
        Some(worker) => worker.workspace_path().to_path_buf(),
        None => return Err(gone(&id)),
    };
    for input in &inputs {
        match std::fs::remove_file(ws.join(&input.path)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ApiError::Validation(format!(
                    "cannot stage file at '{}': {e}",
                    input.path
                )));
            }
        }
    }
    let staged = workspace::stage(state.store.as_ref(), caller.owner(), &ws, &inputs).await?;
    guard.baseline.merge(staged);
    let slot = state.pool.acquire_session_slot().await?;
    session.touch(false);
    let worker = guard.worker.as_mut().ok_or_else(|| gone(&id))?;
    let interrupt = Interrupt {
        grace,
        now: &interrupt,
    };
    let ran = tokio::select! {
        ran = worker.run(job, &limits, chunks, interrupt) => Some(ran),
        () = session.ended.cancelled() => None,
    };
    drop(slot);
    session.touch(true);
    let Some(ran) = ran else {
        guard.mark_dead("it was deleted".into());
        return Err(ApiError::Gone(format!(
            "Session '{id}' was deleted while this run was in progress; its worker was killed."
        )));
    };
    let ran = match ran {
        Ok(ran) => ran,
        Err(RunError::WorkerLost(e)) => {
            return Err(lose(
                &state,
                &session,
                &mut guard,
                format!("its worker was gone ({e})"),
            ));
        }
    };
    let collected = workspace::collect(
        state.store.as_ref(),
        caller.file_owner(),
        &ws,
        &guard.baseline,
        collect_limits(&state),
    )
    .await;
    guard.baseline = workspace::snapshot(&ws, state.config.workspace.max_entries).await;
    let mut response = ExecuteResponse::from(ran.outcome);
    response.files = collected.files;
    response.skipped_files = collected.skipped;
    if let Some(reason) = ran.lost {
        response.stderr.push_str(&format!(
            "\nThe session is gone: {reason}. Its state is lost; further calls on it get 410."
        ));
        tracing::warn!(session = %id, %reason, "session worker lost");
        state.sessions.lose(&id, reason.clone());
        guard.mark_dead(reason);
    }
    Ok(response)
}

/// Marks the session dead for `reason` and says so (410).
fn lose(
    state: &SharedState,
    session: &Session,
    guard: &mut SessionState,
    reason: String,
) -> ApiError {
    tracing::warn!(session = %session.id, %reason, "session worker lost");
    state.sessions.lose(&session.id, reason.clone());
    guard.mark_dead(reason.clone());
    SessionError::Gone {
        id: session.id.clone(),
        reason,
    }
    .into()
}

fn gone(id: &str) -> ApiError {
    SessionError::Gone {
        id: id.to_owned(),
        reason: "its worker is gone".into(),
    }
    .into()
}
