//! `POST /v1/execute`, wire-compatible with the Onyx code interpreter.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use snakecage_worker::protocol::Job;

use super::SharedState;
use super::json::ApiJson;
use crate::error::ApiError;
use crate::pool::run::{RunLimits, RunOutcome, RunVerdict};

#[derive(Debug, Deserialize)]
pub struct ExecuteRequest {
    pub code: String,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default = "default_true")]
    pub last_line_interactive: bool,
    #[serde(default)]
    pub files: Vec<FileInput>,
}

fn default_true() -> bool {
    true
}

/// A stored file to place in the workspace before the code runs.
#[derive(Debug, Clone, Deserialize)]
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
    pub files: Vec<serde_json::Value>,
    pub verdict: RunVerdict,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

impl From<RunOutcome> for ExecuteResponse {
    fn from(o: RunOutcome) -> Self {
        let mut stderr = o.stderr;
        if o.verdict == RunVerdict::Killed {
            let why = match o.signal {
                Some(sig) => format!(
                    "\nThe worker was killed by signal {sig} ({}).",
                    signal_name(sig)
                ),
                None => "\nThe worker died without reporting a result.".to_owned(),
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
            verdict: o.verdict,
            stdout_truncated: o.stdout_truncated,
            stderr_truncated: o.stderr_truncated,
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    nix::sys::signal::Signal::try_from(sig).map_or("unknown", |s| s.as_str())
}

pub async fn execute(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Json<ExecuteResponse>, ApiError> {
    let limits = run_limits(&state, req.timeout_ms)?;
    if let Some(file) = req.files.first() {
        return Err(ApiError::Validation(format!(
            "files: cannot stage file {:?} at {:?}: staging stored files is not supported by this build yet",
            file.file_id, file.path
        )));
    }
    let job = Job {
        code: req.code,
        stdin: req.stdin,
        last_line_interactive: req.last_line_interactive,
        entrypoint: None,
        args: Vec::new(),
    };
    let outcome = state.pool.execute(job, &limits, None).await?;
    Ok(Json(outcome.into()))
}

/// Validates `timeout_ms` against the configured maximum.
pub fn run_limits(state: &SharedState, timeout_ms: Option<u64>) -> Result<RunLimits, ApiError> {
    let limits = &state.config.limits;
    let timeout_ms = timeout_ms.unwrap_or(limits.default_timeout_ms);
    if timeout_ms == 0 {
        return Err(ApiError::Validation(
            "timeout_ms must be greater than 0".into(),
        ));
    }
    if timeout_ms > limits.max_timeout_ms {
        return Err(ApiError::Validation(format!(
            "timeout_ms exceeds maximum of {} ms",
            limits.max_timeout_ms
        )));
    }
    Ok(RunLimits {
        timeout: Duration::from_millis(timeout_ms),
        max_output_bytes: limits.max_output_bytes,
    })
}
