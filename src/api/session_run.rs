//! Running code in a session (`/v1/sessions/{id}/execute` and `…/execute/stream`): stage
//! the request's files, run, report new files and the session's state. A replay session
//! whose worker was lost is rebuilt first, and the response says so.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

use super::SharedState;
use super::execute::{self, ExecuteRequest, ExecuteResponse, Prepared, collect_limits};
use super::json::ApiJson;
use super::stream::{self, OnDisconnect};
use crate::auth::Caller;
use crate::codemode::caller::caller_events;
use crate::error::ApiError;
use crate::files::workspace::{self, StageInput};
use crate::metrics::labels::{Kind, Outcome};
use crate::pool::output_feed::{OutputSender, output_feed};
use crate::pool::run::{Cancelled, Interrupt, RunError, RunLimits, RunOutcome, SessionRun};
use crate::pool::session::Listed;
use crate::pool::toolcalls::RunTools;
use crate::pool::worker::ZygoteEnd;
use crate::sessions::replay::{self, RebuildError, ReplayStager};
use crate::sessions::{Held, Session, SessionError, SessionIndicator, SessionState};

/// How long listing variables or resetting may take before the worker is interrupted.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn execute(
    State(state): State<SharedState>,
    caller: Caller,
    UrlPath(id): UrlPath<String>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Json<ExecuteResponse>, ApiError> {
    let mut prepared = execute::prepare(&state, &caller, req).await?;
    if !prepared.declared_tools.is_empty() {
        return Err(declared_tools_need_a_stream(&id));
    }
    let handle = super::runs::attach_tools(&state, &caller, &mut prepared, None)?;
    let session = state.sessions.get(&id, caller.owner())?;
    let guard = session.lock().await?;
    let slot = caller.execution_slot()?;
    // The run goes on in a task of its own: a client that goes away (an HTTP timeout
    // shorter than the run) drops this future, and a run dropped half-way would leave the
    // session's worker with a job nobody reads, and the session lost. Instead the client's
    // going interrupts the job as its deadline would; the session keeps its state.
    let interrupt = CancellationToken::new();
    let on_disconnect = interrupt.clone().drop_guard();
    let run = run(state, caller, session, guard, prepared, None, interrupt);
    let response = tokio::spawn(async move {
        let _slot = slot;
        let _run = handle;
        run.await
    })
    .await
    .map_err(|e| ApiError::Internal(format!("a session run's task failed: {e}")))??;
    on_disconnect.disarm();
    // The handler is still here, so its client is: the run was not left unstarted.
    Ok(Json(response.ok_or_else(unstarted_with_its_client_here)?))
}

/// The 422 for tools declared on a session's non-streamed execute: their calls go to the
/// client as events, which only the session's stream carries (`attach_tools`' own refusal
/// names `/v1/execute/stream`, which would run outside the session).
fn declared_tools_need_a_stream(id: &str) -> ApiError {
    ApiError::Validation(format!(
        "this request declares tools, which its own client answers: send it to POST \
         /v1/sessions/{id}/execute/stream, where each call arrives as a tool_call event to \
         answer with POST /v1/runs/{{run_id}}/tool_calls/{{call_id}}"
    ))
}

pub async fn execute_stream(
    State(state): State<SharedState>,
    caller: Caller,
    UrlPath(id): UrlPath<String>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Response, ApiError> {
    // Everything that can be answered with a status is answered before the stream starts.
    let mut prepared = execute::prepare(&state, &caller, req).await?;
    let (calls_tx, calls_rx) = caller_events(super::runs::TOOL_CALL_BUFFER);
    let handle = super::runs::attach_tools(&state, &caller, &mut prepared, Some(calls_tx))?;
    let run_id = handle.entry.id.clone();
    let session = state.sessions.get(&id, caller.owner())?;
    let guard = session.lock().await?;
    let slot = caller.execution_slot()?;
    let (tx, rx) = output_feed();
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
        // Unstarted only for a client gone: the stream that would carry this is dropped.
        run.await?.ok_or_else(unstarted_with_its_client_here)
    };
    let mut response =
        stream::sse_with_tool_calls(rx, Some(calls_rx), run, OnDisconnect::Interrupt, interrupt)?
            .into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(&run_id) {
        response.headers_mut().insert(execute::RUN_ID_HEADER, value);
    }
    Ok(response)
}

/// The 500 for a session run left unstarted while its client is still there: `interrupt`
/// fires only when the client has gone, so this is never expected.
fn unstarted_with_its_client_here() -> ApiError {
    ApiError::Internal("a session run was left unstarted though its client is still there".into())
}

/// One job in a session, counted in the metrics; `None` when its client went away while
/// it waited for a slot, so it never started (like an abandoned stateless request, it
/// counts as no execution).
async fn run(
    state: SharedState,
    caller: Caller,
    session: Arc<Session>,
    guard: Held,
    prepared: Prepared,
    chunks: Option<OutputSender>,
    interrupt: CancellationToken,
) -> Result<Option<ExecuteResponse>, ApiError> {
    let started = std::time::Instant::now();
    let metrics = state.metrics.clone();
    let tenant = caller.owner().map(str::to_owned);
    let result = run_in(state, caller, session, guard, prepared, chunks, interrupt).await;
    let outcome = match &result {
        Ok(Some(response)) => Some(Outcome::from(response.verdict)),
        Ok(None) => None,
        Err(e) => e.is_shed().then_some(Outcome::Rejected),
    };
    if let Some(outcome) = outcome {
        metrics.execution_finished(Kind::Session, outcome, started.elapsed(), None);
    }
    if let (Ok(Some(_)), Some(tenant)) = (&result, tenant) {
        metrics.tenant_execution(&tenant, Kind::Session);
    }
    result
}

/// Stages the request's files (replacing files of the same name), takes an execution slot,
/// runs, reports new and changed files and the session's state. A worker lost on the way
/// marks the session dead (410 from then on), or, with `replay`, to be rebuilt.
///
/// `None`: `interrupt` fired (its client went away) while the run waited in the queue for
/// a slot. The job was never sent, so the session's globals are untouched (its files
/// were staged, as a retry would stage them again), and returning frees the session at
/// once: a client that timed out and sends its cell again must not have it run twice.
/// A run its client cancels there (`DELETE /v1/runs/{id}`) ends the same way, but its
/// client is still there: it is answered, verdict `killed`, saying that the run never
/// started and the session's state is untouched, with that state.
async fn run_in(
    state: SharedState,
    caller: Caller,
    session: Arc<Session>,
    mut guard: Held,
    prepared: Prepared,
    chunks: Option<OutputSender>,
    interrupt: CancellationToken,
) -> Result<Option<ExecuteResponse>, ApiError> {
    let Prepared {
        limits,
        inputs,
        job,
        ..
    } = prepared;
    let id = session.id.clone();
    let grace = state.sessions.settings().interrupt_grace;
    let mut notices = Vec::new();
    let mut replayed = ensure_worker(&state, caller.owner(), &session, &mut guard).await?;
    let ws = worker_path(&guard, &id)?;
    // Files already at their paths are replaced (see `workspace::stage`).
    let staged = workspace::stage(state.store.as_ref(), caller.owner(), &ws, &inputs).await?;
    guard.baseline.merge(staged);
    notices.extend(guard.journal.as_mut().and_then(|j| j.stage(&inputs)));
    // A replay session keeps the job: for its journal, and to retry it on a rebuilt worker
    // when the old one turns out to be gone before it took the job.
    let kept = guard.journal.is_some().then(|| job.clone());
    let mut job = Some(job);
    let (ran, recorder) = loop {
        let this_job = match job.take() {
            Some(job) => job,
            None => kept.clone().expect("a retry only happens with a journal"),
        };
        // A replay session's run has its tool calls recorded, to be answered from the
        // journal if it is ever replayed (a fresh record for each attempt).
        let recorder = guard
            .journal
            .as_ref()
            .and_then(|j| j.recorder(limits.tools.as_ref()));
        let run_limits = match &recorder {
            Some(recorder) => RunLimits {
                tools: Some(RunTools(recorder.clone())),
                ..limits.clone()
            },
            None => limits.clone(),
        };
        // Biased: a slot that comes with the client's going (or its cancel) does not start
        // the job either.
        let waiting = std::time::Instant::now();
        let cancel = limits.cancel.clone().unwrap_or_default();
        let slot = tokio::select! {
            biased;
            () = interrupt.cancelled() => return Ok(None),
            () = session.ended.cancelled() => None,
            () = cancel.cancelled() => None,
            slot = state.pool.acquire_session_slot() => Some(slot?),
        };
        // Deleted while the run waited (a queued run holds the session, so nothing else
        // ends it): answered at once, and the job is never sent, not even when the slot
        // came with the deletion.
        if session.ended.is_cancelled() {
            guard.mark_dead("it was deleted".into());
            return Err(ApiError::Gone(format!(
                "Session '{id}' was deleted while this run waited for an execution slot; the \
                 run never started."
            )));
        }
        let Some(slot) = slot else {
            let outcome = RunOutcome::cancelled_in_queue(waiting.elapsed());
            break (
                SessionRun {
                    outcome,
                    lost: None,
                },
                None,
            );
        };
        session.touch(false);
        let worker = guard.worker.as_mut().ok_or_else(|| gone(&id))?;
        let interrupt = Interrupt {
            grace,
            now: &interrupt,
        };
        let ran = tokio::select! {
            biased;
            () = session.ended.cancelled() => None,
            ran = worker.run(this_job, &run_limits, chunks.clone(), interrupt) => Some(ran),
        };
        drop(slot);
        session.touch(true);
        let Some(ran) = ran else {
            guard.mark_dead("it was deleted".into());
            return Err(ApiError::Gone(format!(
                "Session '{id}' was deleted while this run was in progress; its worker was killed."
            )));
        };
        match ran {
            Ok(ran) => break (ran, recorder),
            Err(e @ (RunError::WorkerLost(_) | RunError::DiedWithItsZygote { .. })) => {
                // A worker found dead by its job: say how it died, when its exit says.
                let why = match (&e, guard.worker.as_mut()) {
                    (RunError::WorkerLost(_), Some(worker)) => worker.why_gone().await,
                    _ => None,
                };
                let reason = why.unwrap_or_else(|| format!("its worker was gone ({e})"));
                if replayed.is_some() || !guard.mark_lost(reason.clone()) {
                    return Err(lose(&state, &session, &mut guard, reason));
                }
                // The job never reached the worker: rebuild, then run it on the new one.
                replayed = ensure_worker(&state, caller.owner(), &session, &mut guard).await?;
            }
        }
    };
    let succeeded = ran.outcome.exit_code == Some(0) && !ran.outcome.timed_out;
    let never_started = ran.outcome.cancelled == Cancelled::Queued;
    let ws = worker_path(&guard, &id)?;
    let collected = workspace::collect(
        &state.store,
        caller.file_owner(),
        &ws,
        &guard.baseline,
        collect_limits(&state),
    )
    .await;
    guard.baseline = workspace::snapshot(&ws, state.config().workspace.max_entries).await;
    let over_bound = over_bound(&state, &guard.baseline);
    // The service is going: a replay session's history goes with it.
    let shutting_down = ran.outcome.zygote_end == Some(ZygoteEnd::ShutDown);
    let signal = ran.outcome.signal;
    let mut response = ExecuteResponse::from(ran.outcome);
    if never_started {
        response.stderr.push_str(if inputs.is_empty() {
            " The session's state is untouched."
        } else {
            " The session's variables are untouched; the files the request sent are in its \
             workspace, as a retry puts them there again."
        });
    }
    response.files = collected.files;
    response.skipped_files = collected.skipped;
    super::timeout::explain(
        &mut response,
        signal,
        limits.timeout,
        state.config().limits.max_timeout_ms,
    );
    if let Some((runs, reason)) = &replayed {
        response.replayed = Some(*runs);
        notices.insert(0, replayed_notice(*runs, reason));
    }
    let lost = match ran.lost {
        Some(reason) => Some(reason),
        // Ended below, for good: neither journalled nor listed.
        None if over_bound.is_some() => None,
        None => {
            if let (true, Some(job), Some(journal)) = (succeeded, &kept, guard.journal.as_mut()) {
                let recorded = recorder.map(|r| r.take());
                notices.extend(journal.run(job, &limits, recorded));
            }
            let worker = guard.worker.as_mut().ok_or_else(|| gone(&id))?;
            match worker.variables(CONTROL_TIMEOUT, grace).await {
                Ok(listed) => {
                    response.session = Some(indicator(&listed, session.expires_at()));
                    None
                }
                Err(e) => Some(e.to_string()),
            }
        }
    };
    if let Some(reason) = over_bound {
        tracing::warn!(session = %id, %reason, "session ended: its workspace is over its bound");
        // Not replayed: replaying its runs would write the same files again.
        let reason = format!("it was ended because {reason}");
        state.sessions.lose(&id, reason.clone());
        guard.mark_dead(reason.clone());
        let note = format!(
            "The session is gone: {reason}. Its variables are lost and further calls on it get \
             410; the files its runs wrote were stored, within the limits of what a run may store \
             (see files and skipped_files). Start a new session and \
             stage only the files it needs, or keep large data in the file store."
        );
        response.stderr.push('\n');
        response.stderr.push_str(&note);
        notices.push(note);
    } else if let Some(reason) = lost {
        tracing::warn!(session = %id, %reason, "session worker lost");
        let note = if !shutting_down && guard.mark_lost(reason.clone()) {
            let runs = guard.journal.as_ref().map_or(0, |j| j.runs());
            format!(
                "The session's worker was lost during this run ({reason}); what this run did is \
                 not kept. The session's {runs} successful runs will be replayed on a new worker \
                 before its next run."
            )
        } else {
            let reason = guard.final_reason(reason);
            state.sessions.lose(&id, reason.clone());
            guard.mark_dead(reason.clone());
            let later = if shutting_down {
                "once the service is back, calls on it get 410"
            } else {
                "further calls on it get 410"
            };
            format!("The session is gone: {reason}. Its state is lost; {later}.")
        };
        response.stderr.push('\n');
        response.stderr.push_str(&note);
        notices.push(note);
    }
    if !notices.is_empty() {
        response.notice = Some(notices.join(" "));
    }
    Ok(Some(response))
}

/// Why the session's workspace, as its snapshot after the run measured it, is past its
/// bound (`sessions.max_workspace_mb`, `workspace.max_entries`), if it is. The bound is
/// at most a quarter of the workspace file system, so that one session cannot keep a
/// small one (a container's) full past its run.
fn over_bound(state: &SharedState, baseline: &workspace::Staged) -> Option<String> {
    let footprint = baseline.footprint()?;
    let config = state.config();
    let quarter = (state.pool.workspace_usage()).map_or(u64::MAX, |fs| fs.size_bytes / 4);
    let max_bytes = (config.sessions.max_workspace_mb.saturating_mul(1 << 20)).min(quarter);
    footprint.over(max_bytes, config.workspace.max_entries)
}

fn replayed_notice(runs: usize, reason: &str) -> String {
    format!(
        "The session's worker had been lost ({reason}); a new worker replayed the session's \
         {runs} successful runs before this one (their output is not shown; their side \
         effects, such as files written, happened again, but their tool calls, if any, were \
         answered from the session's journal: no tool was called again)."
    )
}

fn indicator(listed: &Listed, expires_at: String) -> SessionIndicator {
    SessionIndicator {
        variables: listed.total,
        names: listed.variables.iter().map(|v| v.name.clone()).collect(),
        expires_at,
    }
}

fn worker_path(guard: &SessionState, id: &str) -> Result<std::path::PathBuf, ApiError> {
    match guard.worker.as_ref() {
        Some(worker) => Ok(worker.workspace_path().to_path_buf()),
        None => Err(gone(id)),
    }
}

/// Stages a replayed session's files from the store, as its runs did.
struct Restager<'a> {
    state: &'a SharedState,
    owner: Option<&'a str>,
}

impl ReplayStager for Restager<'_> {
    fn stage<'a>(
        &'a self,
        workspace: &'a Path,
        inputs: &'a [StageInput],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            workspace::stage(self.state.store.as_ref(), self.owner, workspace, inputs)
                .await
                .map(drop)
                .map_err(|e| ApiError::from(e).to_string())
        })
    }
}

/// Makes sure the session has a live worker. A replay session whose worker was lost (or is
/// found dead now) gets a new one with its journal replayed: `Some((runs, why))`. A
/// session without `replay` whose worker is dead is lost (410).
pub async fn ensure_worker(
    state: &SharedState,
    owner: Option<&str>,
    session: &Session,
    guard: &mut SessionState,
) -> Result<Option<(usize, String)>, ApiError> {
    if let Some(worker) = guard.worker.as_mut() {
        if worker.is_alive() {
            return Ok(None);
        }
        let reason = worker
            .why_gone()
            .await
            .unwrap_or_else(|| "its worker had exited".to_owned());
        if !guard.mark_lost(reason.clone()) {
            return Err(lose(state, session, guard, reason));
        }
    }
    let Some(reason) = guard.lost.clone() else {
        return Err(gone(&session.id));
    };
    let journal = guard
        .journal
        .as_ref()
        .expect("only a replay session is lost");
    let settings = state.sessions.settings();
    let slot = state.pool.acquire_session_slot().await?;
    let stager = Restager { state, owner };
    let rebuilt = replay::rebuild(
        &state.pool,
        journal,
        settings.interrupt_grace,
        CONTROL_TIMEOUT,
        &stager,
    )
    .await;
    drop(slot);
    match rebuilt {
        Ok(rebuilt) => {
            let ws = rebuilt.worker.workspace_path().to_path_buf();
            session.set_generation(rebuilt.worker.generation());
            guard.worker = Some(rebuilt.worker);
            guard.lost = None;
            // Files the replay wrote again are not news to the caller.
            guard.baseline = workspace::snapshot(&ws, state.config().workspace.max_entries).await;
            tracing::info!(session = %session.id, runs = rebuilt.runs, "session rebuilt by replay");
            Ok(Some((rebuilt.runs, reason)))
        }
        Err(RebuildError::Pool(e)) => Err(e.into()),
        Err(RebuildError::Failed(why)) => Err(lose(
            state,
            session,
            guard,
            format!("its worker was lost ({reason}) and {why}"),
        )),
    }
}

/// Marks the session dead for `reason` and says so (410).
pub fn lose(
    state: &SharedState,
    session: &Session,
    guard: &mut SessionState,
    reason: String,
) -> ApiError {
    let reason = guard.final_reason(reason);
    tracing::warn!(session = %session.id, %reason, "session worker lost");
    state.sessions.lose(&session.id, reason.clone());
    guard.mark_dead(reason.clone());
    SessionError::Gone {
        id: session.id.clone(),
        reason,
    }
    .into()
}

pub fn gone(id: &str) -> ApiError {
    SessionError::Gone {
        id: id.to_owned(),
        reason: "its worker is gone".into(),
    }
    .into()
}
