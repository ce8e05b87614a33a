//! `POST /v1/execute` and `POST /v1/execute/stream`, wire-compatible with the Onyx code
//! interpreter: stage the request's files, run `code` (or a staged `entrypoint` with
//! `args`), store what the run wrote.

use std::path::Path;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use snakecage_worker::protocol::{
    EXIT_HARDENING_FAILED, EXIT_PROTOCOL, ErrorInfo, Job, MimeBundle,
};
use tower_http::request_id::RequestId;

use super::SharedState;
use super::json::ApiJson;
use crate::auth::Caller;
use crate::codemode::caller::caller_events;
use crate::error::ApiError;
use crate::files::workspace::{
    self, CollectLimits, SkippedFile, StageInput, Staged, WorkspaceFile,
};
use crate::files::{FileStore, StoreError};
use crate::markdown;
use crate::metrics::labels::{Kind, Outcome};
use crate::pool::Stager;
use crate::pool::events::KillReason;
use crate::pool::output_feed::{OutputSender, output_feed};
use crate::pool::run::{Cancelled, ProtocolViolation, RunLimits, RunOutcome, RunVerdict};
use crate::pool::worker::ZygoteEnd;
use crate::sessions::SessionIndicator;

/// An unknown field is refused (422 naming it and the known ones): a misspelt
/// `timeout_ms` would otherwise run with the default timeout, silently.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// Exactly one of `code` and `entrypoint`; a string or an array of lines.
    #[serde(default, deserialize_with = "super::code_field::deserialize")]
    pub code: Option<String>,
    /// A staged file to run as `__main__`, like `python <entrypoint> <args>`.
    #[serde(default)]
    pub entrypoint: Option<String>,
    #[serde(default, deserialize_with = "super::nullable::or_default")]
    pub args: Vec<String>,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default, deserialize_with = "super::whole_number::optional")]
    pub timeout_ms: Option<u64>,
    #[serde(
        default = "default_true",
        deserialize_with = "super::nullable::or_true"
    )]
    pub last_line_interactive: bool,
    #[serde(default, deserialize_with = "super::nullable::or_default")]
    pub files: Vec<FileInput>,
    /// `markdown`: `code` is a model's answer; its ```python blocks run, in order.
    #[serde(default)]
    pub code_format: CodeFormat,
    /// Tools the caller declares and answers itself (Code Mode, `/v1/execute/stream`).
    #[serde(default, deserialize_with = "super::nullable::or_default")]
    pub tools: Vec<serde_json::Value>,
}

impl super::json::JsonObject for ExecuteRequest {
    const SKETCH: &'static str = r#"{"code": ...}"#;
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CodeFormat {
    #[default]
    Python,
    Markdown,
}

/// Read through a string: serde_json calls any value but a string or an object given for
/// an enum a syntax error ("expected value"), which would be a 400 saying the body is not
/// JSON. `null` is the default; anything else names the formats there are.
impl<'de> Deserialize<'de> for CodeFormat {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const FORMATS: &[&str] = &["python", "markdown"];
        match Option::<String>::deserialize(deserializer)?.as_deref() {
            None | Some("python") => Ok(Self::Python),
            Some("markdown") => Ok(Self::Markdown),
            Some(other) => Err(serde::de::Error::unknown_variant(other, FORMATS)),
        }
    }
}

/// A stored file to place in the workspace before the code runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileInput {
    pub path: String,
    pub file_id: String,
}

#[derive(Debug, Serialize)]
pub struct ExecuteResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// New or changed files (stored, with ids) and new directories the run left.
    pub files: Vec<WorkspaceFile>,
    /// Workspace entries that were not stored, and why (links, limits, quota).
    pub skipped_files: Vec<SkippedFile>,
    pub verdict: RunVerdict,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The program's uncaught exception (`{"type", "message"}`, each cut to a bound the
    /// worker sets), null when it raised none or its worker never reported.
    pub error: Option<ErrorInfo>,
    /// Rich outputs (MIME bundles) in the order produced, like a notebook cell's.
    pub results: Vec<MimeBundle>,
    /// Session runs: the session's state after the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionIndicator>,
    /// Session runs that first rebuilt a lost worker: how many runs were replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<usize>,
    /// What the caller must know beyond this run's output (a replay, a lost worker).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

impl From<RunOutcome> for ExecuteResponse {
    fn from(mut o: RunOutcome) -> Self {
        let mut stderr = o.stderr;
        if o.cancelled == Cancelled::Queued {
            stderr.push_str(CANCELLED_IN_QUEUE);
        } else if o.cancelled == Cancelled::Running && o.result.is_some() {
            stderr.push_str(
                "\nThe run was cancelled by its client: interrupted, the session's state kept.",
            );
        } else if o.cancelled == Cancelled::Running {
            stderr.push_str("\nThe run was cancelled by its client; its worker was killed.");
        } else if matches!(o.kill, Some(KillReason::ProtocolViolation)) {
            // Whatever its exit status: a job that wrote to the job socket itself exits 0.
            let violation = o.violation.unwrap_or(ProtocolViolation::Garbled);
            stderr.push_str(&format!(
                "\nThe worker broke the job protocol and was killed: its job socket (fd 3) \
                 {violation}, which is what a job writing to fd 3 causes."
            ));
        } else if let Some(why) = &o.out_of_memory {
            stderr.push_str(&format!(
                "\nThe worker was killed by signal 9 (SIGKILL): {why}."
            ));
        } else if o.verdict == RunVerdict::Killed {
            let why = match (o.signal, o.exited) {
                (Some(sig), _) => format!(
                    "\nThe worker was killed by signal {sig} ({}).",
                    signal_name(sig)
                ),
                (None, Some(code)) if code == EXIT_PROTOCOL || code == EXIT_HARDENING_FAILED => {
                    format!("\nThe worker failed (status {code}) before reporting a result.")
                }
                (None, Some(code)) => format!(
                    "\nThe worker exited with status {code} before reporting a result \
                     (os._exit() ends the process at once; sys.exit() sets the exit code)."
                ),
                (None, None) => match o.zygote_end {
                    Some(end) => died_with_its_zygote(end).to_owned(),
                    None => "\nThe worker died without reporting a result.".to_owned(),
                },
            };
            stderr.push_str(&why);
        }
        Self {
            stdout: o.stdout,
            stderr,
            exit_code: o.exit_code,
            timed_out: o.timed_out,
            duration_ms: o.duration.as_millis() as u64,
            files: Vec::new(),
            skipped_files: Vec::new(),
            verdict: o.verdict,
            stdout_truncated: o.stdout_truncated,
            stderr_truncated: o.stderr_truncated,
            error: o.result.as_mut().and_then(|r| r.error.take()),
            results: o.result.map(|r| r.results).unwrap_or_default(),
            session: None,
            replayed: None,
            notice: None,
        }
    }
}

/// The stderr of a run cancelled while it waited for a slot (the run wrote none).
pub const CANCELLED_IN_QUEUE: &str = "The run was cancelled by its client while it waited in \
     the queue for a slot: it never started, and none of its code ran.";

/// The last line of stderr of a run whose worker died with its zygote (the only way it
/// dies without an exit status of its own).
fn died_with_its_zygote(end: ZygoteEnd) -> &'static str {
    match end {
        ZygoteEnd::ShutDown => {
            "\nThe service shut down before this run ended: in-flight runs had its grace \
             period (worker.shutdown_grace_ms) to finish, then their workers were killed."
        }
        ZygoteEnd::Died => {
            "\nThe worker was killed because its zygote, the process it was forked from, \
             died: by design a worker dies with its zygote (PR_SET_PDEATHSIG), so that no \
             sandboxed process outlives the one that reaps it. The service restarts the \
             zygote."
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    nix::sys::signal::Signal::try_from(sig).map_or("unknown", |s| s.as_str())
}

pub async fn execute(
    State(state): State<SharedState>,
    caller: Caller,
    request_id: Option<Extension<RequestId>>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Json<ExecuteResponse>, ApiError> {
    let mut prepared = prepare(&state, &caller, req).await?;
    let _run = super::runs::attach_tools(&state, &caller, &mut prepared, None)?;
    let _slot = caller.execution_slot()?;
    let id = request_id_str(request_id.as_ref());
    Ok(Json(
        run_stateless(&state, &caller, prepared, None, id.as_deref()).await?,
    ))
}

fn request_id_str(id: Option<&Extension<RequestId>>) -> Option<String> {
    id.and_then(|id| id.header_value().to_str().ok())
        .map(str::to_owned)
}

/// The same run as SSE (see `stream`); validation errors are answered before it starts. A
/// client that disconnects mid-stream kills its worker.
pub async fn execute_stream(
    State(state): State<SharedState>,
    caller: Caller,
    request_id: Option<Extension<RequestId>>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let mut prepared = prepare(&state, &caller, req).await?;
    let (calls_tx, calls_rx) = caller_events(super::runs::TOOL_CALL_BUFFER);
    let handle = super::runs::attach_tools(&state, &caller, &mut prepared, Some(calls_tx))?;
    let run_id = handle.entry.id.clone();
    let slot = caller.execution_slot()?;
    let id = request_id_str(request_id.as_ref());
    let (tx, rx) = output_feed();
    let run = async move {
        let _slot = slot;
        let _run = handle;
        run_stateless(&state, &caller, prepared, Some(tx), id.as_deref()).await
    };
    let stream = super::stream::sse_with_tool_calls(
        rx,
        Some(calls_rx),
        run,
        super::stream::OnDisconnect::Kill,
        tokio_util::sync::CancellationToken::new(),
    )?;
    let mut response = stream.into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(&run_id) {
        response.headers_mut().insert(RUN_ID_HEADER, value);
    }
    Ok(response)
}

/// The response header that names a streamed run (for `DELETE /v1/runs/{run_id}`).
pub const RUN_ID_HEADER: &str = "x-run-id";

/// A request checked and turned into a job, before any worker is spent on it.
pub struct Prepared {
    pub limits: RunLimits,
    pub inputs: Vec<StageInput>,
    pub job: Job,
    /// Tools the request declared (its client answers them); see `runs::attach_tools`.
    pub declared_tools: Vec<snakecage_worker::toolspec::ToolSpec>,
}

/// Validates a request: limits, paths, the job, and that every file id exists (for the
/// caller: another tenant's file id is unknown).
pub async fn prepare(
    state: &SharedState,
    caller: &Caller,
    req: ExecuteRequest,
) -> Result<Prepared, ApiError> {
    let limits = run_limits(state, req.timeout_ms)?;
    let inputs = stage_inputs(&req.files)?;
    let declared_tools =
        crate::codemode::caller::parse_declared(&req.tools, state.config().tools.max_caller_tools)
            .map_err(ApiError::Validation)?;
    let mut job = job(req, &inputs)?;
    job.max_bundle_bytes = state.config().limits.max_bundle_bytes;
    // Unknown ids are answered before a worker is spent on the request.
    check_file_ids(state, caller, &inputs).await?;
    Ok(Prepared {
        limits,
        inputs,
        job,
        declared_tools,
    })
}

/// Runs a prepared request on a fresh worker and stores the files it wrote; output chunks
/// go to `chunks` as they come when it is given. Every run that got to the pool is counted
/// in the metrics (a request refused at validation is no execution).
pub async fn run_stateless(
    state: &SharedState,
    caller: &Caller,
    prepared: Prepared,
    chunks: Option<OutputSender>,
    request_id: Option<&str>,
) -> Result<ExecuteResponse, ApiError> {
    let started = Instant::now();
    let result = run_prepared(state, caller, prepared, chunks).await;
    let outcome = match &result {
        Ok(response) => Some(Outcome::from(response.verdict)),
        Err(e) => e.is_shed().then_some(Outcome::Rejected),
    };
    if let Some(outcome) = outcome {
        state
            .metrics
            .execution_finished(Kind::Stateless, outcome, started.elapsed(), request_id);
    }
    if let (Ok(_), Some(tenant)) = (&result, caller.owner()) {
        state.metrics.tenant_execution(tenant, Kind::Stateless);
    }
    result
}

async fn run_prepared(
    state: &SharedState,
    caller: &Caller,
    prepared: Prepared,
    chunks: Option<OutputSender>,
) -> Result<ExecuteResponse, ApiError> {
    let Prepared {
        limits,
        inputs,
        job,
        ..
    } = prepared;
    let stager = StoreStager {
        store: state.store.as_ref(),
        owner: caller.owner(),
        inputs: &inputs,
    };
    let mut finished = state.pool.execute_in(job, &limits, chunks, &stager).await?;
    let collected = match (finished.workspace_path(), &finished.staged) {
        (Some(path), Some(staged)) => {
            workspace::collect(
                &state.store,
                caller.file_owner(),
                path,
                staged,
                collect_limits(state),
            )
            .await
        }
        _ => workspace::Collected::default(),
    };
    // Gone before the answer: a client that runs its next job as soon as it has this one's
    // finds the space this one's files took free again (or it would be freed a moment
    // later, in the background, and a job that filled the bound would fail the next).
    finished.remove_workspace().await;
    let signal = finished.outcome.signal;
    let mut response = ExecuteResponse::from(finished.outcome);
    response.files = collected.files;
    response.skipped_files = collected.skipped;
    super::timeout::explain(
        &mut response,
        signal,
        limits.timeout,
        state.config().limits.max_timeout_ms,
    );
    Ok(response)
}

/// 404 for the first staged file id the caller cannot see (unknown, or another tenant's:
/// the same answer, so existence is not revealed).
pub async fn check_file_ids(
    state: &SharedState,
    caller: &Caller,
    inputs: &[StageInput],
) -> Result<(), ApiError> {
    for input in inputs {
        match state.store.meta(&input.file_id, caller.owner()).await {
            Ok(_) => {}
            Err(StoreError::NotFound(_)) => {
                return Err(ApiError::FileNotFound(format!(
                    "File with ID '{}' not found for path '{}'",
                    input.file_id, input.path
                )));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Checks and normalises the paths of `files`.
pub fn stage_inputs(files: &[FileInput]) -> Result<Vec<StageInput>, ApiError> {
    let mut inputs: Vec<StageInput> = Vec::with_capacity(files.len());
    for file in files {
        let path = workspace::normalize_path(&file.path).map_err(ApiError::Validation)?;
        if inputs.iter().any(|i| i.path == path) {
            return Err(ApiError::Validation(format!(
                "File path '{path}' is given twice; each staged file needs its own path."
            )));
        }
        inputs.push(StageInput {
            path,
            file_id: file.file_id.clone(),
        });
    }
    Ok(inputs)
}

/// The job a request describes: exactly one of `code` and `entrypoint`, and an entrypoint
/// must be one of the staged files.
pub fn job(req: ExecuteRequest, inputs: &[StageInput]) -> Result<Job, ApiError> {
    let entrypoint = match (&req.code, &req.entrypoint) {
        (Some(_), Some(_)) => {
            return Err(ApiError::Validation(
                "give exactly one of `code` and `entrypoint`, not both".into(),
            ));
        }
        (None, None) => {
            return Err(ApiError::Validation(
                "missing field `code`: give the code to run, or an `entrypoint` (a staged file) to run with `args`".into(),
            ));
        }
        (Some(_), None) => {
            if !req.args.is_empty() {
                return Err(ApiError::Validation(
                    "`args` are passed to an `entrypoint`; with `code` leave them out".into(),
                ));
            }
            None
        }
        (None, Some(raw)) => {
            let path = workspace::normalize_path(raw)
                .map_err(|e| ApiError::Validation(format!("entrypoint: {e}")))?;
            if !inputs.iter().any(|i| i.path == path) {
                return Err(ApiError::Validation(format!(
                    "entrypoint '{path}' is not one of the staged files; stage it with files: [{{\"path\": \"{path}\", \"file_id\": \"…\"}}]"
                )));
            }
            Some(path)
        }
    };
    let code = match (req.code_format, req.code) {
        (CodeFormat::Markdown, Some(text)) => Some(markdown::python_blocks(&text).ok_or_else(|| {
            ApiError::Validation(
                "code_format is markdown but `code` has no ```python (or ```py) fenced block to run".into(),
            )
        })?),
        (CodeFormat::Markdown, None) => {
            return Err(ApiError::Validation(
                "code_format markdown applies to `code`, not to an `entrypoint`".into(),
            ));
        }
        (CodeFormat::Python, code) => code,
    };
    Ok(Job {
        code: code.unwrap_or_default(),
        stdin: req.stdin,
        last_line_interactive: req.last_line_interactive,
        entrypoint,
        args: req.args,
        max_bundle_bytes: 0,
        timeout_ms: 0,
        tools: Vec::new(),
        max_concurrent_tool_calls: 1,
    })
}

/// Stages stored files into a worker's workspace.
struct StoreStager<'a> {
    store: &'a dyn FileStore,
    owner: Option<&'a str>,
    inputs: &'a [StageInput],
}

impl Stager for StoreStager<'_> {
    type Staged = Staged;
    type Error = ApiError;

    async fn stage(&self, workspace: &Path) -> Result<Staged, ApiError> {
        Ok(workspace::stage(self.store, self.owner, workspace, self.inputs).await?)
    }
}

pub fn collect_limits(state: &SharedState) -> CollectLimits {
    let config = state.config();
    let ws = &config.workspace;
    CollectLimits {
        max_entries: ws.max_entries,
        max_total_bytes: ws.max_total_mb << 20,
        max_files: ws.max_files,
    }
}

/// Validates `timeout_ms` against the configured maximum.
pub fn run_limits(state: &SharedState, timeout_ms: Option<u64>) -> Result<RunLimits, ApiError> {
    let config = state.config();
    let limits = &config.limits;
    let timeout_ms = timeout_ms.unwrap_or(limits.default_timeout_ms);
    if timeout_ms == 0 {
        return Err(ApiError::Validation(
            "timeout_ms must be greater than 0".into(),
        ));
    }
    if timeout_ms > limits.max_timeout_ms {
        return Err(ApiError::TimeoutTooLarge {
            max_ms: limits.max_timeout_ms,
        });
    }
    Ok(RunLimits {
        timeout: Duration::from_millis(timeout_ms),
        max_output_bytes: limits.max_output_bytes,
        ..RunLimits::default()
    })
}
