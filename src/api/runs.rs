//! Code Mode over HTTP: the tools a run gets (the caller's catalog plus the tools its
//! request declared), `POST /v1/runs/{run_id}/tool_calls/{call_id}` (the client answers a
//! call of a declared tool), `DELETE /v1/runs/{run_id}` (cancel a run) and
//! `GET /v1/tools/catalog?query=` (search the caller's tools).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use snakecage_worker::jsondepth::{self, MAX_TOOL_JSON_DEPTH};

use super::SharedState;
use super::execute::Prepared;
use crate::auth::Caller;
use crate::codemode::caller::{CallerBridge, CallerEvents};
use crate::codemode::{CallLimits, CatalogTool, Provider, Toolbox};
use crate::error::ApiError;
use crate::pool::toolcalls::RunTools;
use crate::runs::{AnswerError, CallerAnswer, RunHandle};

/// `tool_call` events buffered for a slow client.
pub const TOOL_CALL_BUFFER: usize = 16;

/// Registers the run and gives it its tools: the caller's catalog, and the tools its
/// request declared when `events` can carry their calls to the client (a stream). The
/// returned handle keeps the run reachable by id until it is dropped.
pub fn attach_tools(
    state: &SharedState,
    caller: &Caller,
    prepared: &mut Prepared,
    events: Option<CallerEvents>,
) -> Result<RunHandle, ApiError> {
    let run = state.runs.register(caller.owner());
    let mut tools = state.catalog.visible_to(caller.owner());
    let declared = std::mem::take(&mut prepared.declared_tools);
    if !declared.is_empty() {
        let Some(events) = events else {
            return Err(ApiError::Validation(
                "this request declares tools, which its own client answers: send it to POST /v1/execute/stream, where each call arrives as a tool_call event to answer with POST /v1/runs/{run_id}/tool_calls/{call_id}".into(),
            ));
        };
        let bridge = Arc::new(CallerBridge::new(run.entry.clone(), events));
        for spec in declared {
            if tools.iter().any(|t| t.spec.name == spec.name) {
                return Err(ApiError::Validation(format!(
                    "declared tool '{}' has the name of a tool the service offers; rename it",
                    spec.name
                )));
            }
            let name = spec.name.clone();
            let tool = CatalogTool::new(spec, name, Provider::Caller(bridge.clone()), None)
                .map_err(|e| ApiError::Validation(e.to_string()))?;
            tools.push(Arc::new(tool));
        }
    }
    let config = state.config();
    let toolbox = Toolbox::new(
        tools,
        CallLimits::from_config(&config.tools),
        state.metrics.clone(),
    );
    if !toolbox.is_empty() {
        prepared.job.tools = toolbox.specs();
        // The worker and the supervisor both hold the run to it.
        prepared.job.max_concurrent_tool_calls = config.tools.max_concurrent_calls;
        prepared.limits.tools = Some(RunTools(Arc::new(toolbox)));
    }
    prepared.limits.cancel = Some(run.entry.cancel.clone());
    Ok(run)
}

/// The body of an answer: exactly one of `result` and `error`. A tool may answer `null`
/// (`{"result": null}`), so a present `result` counts whatever it holds; an `error` of
/// `null` is no error (clients that always send both fields send it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    #[serde(default, deserialize_with = "present")]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// `Some` for a field that is there, `null` included (`#[serde(default)]` gives `None`
/// for one that is not).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

pub async fn answer_tool_call(
    State(state): State<SharedState>,
    caller: Caller,
    Path((run_id, call_id)): Path<(String, String)>,
    body: Result<super::json::ApiJson<AnswerBody>, ApiError>,
) -> Result<StatusCode, ApiError> {
    let super::json::ApiJson(body) = body.map_err(|e| match e {
        ApiError::PayloadTooLarge(_) => answer_too_large(&state),
        e => e,
    })?;
    let answer = match (body.result, body.error) {
        (Some(result), None) => CallerAnswer::Result(result),
        (None, Some(error)) => CallerAnswer::Error(error_message(error)?),
        _ => {
            return Err(ApiError::Validation(
                "give exactly one of `result` (the tool's JSON result) and `error` (a message, or {\"message\", \"data\"})".into(),
            ));
        }
    };
    held_to_depth(&answer)?;
    match state.runs.answer(&run_id, &call_id, caller.owner(), answer) {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(e @ AnswerError::NoRun(_)) => Err(ApiError::NotFound(e.to_string())),
        Err(e @ AnswerError::NotPending { .. }) => Err(ApiError::ToolCallNotWaiting(e.to_string())),
        Err(e @ AnswerError::Cancelled { .. }) => Err(ApiError::ToolCallCancelled(e.to_string())),
    }
}

/// An answer's `error` as the program will get it: a message, or an object with a
/// `message` string (and any `data`). Anything else (`42`, `true`, a list, an object
/// without a message) is refused rather than turned into a message no one wrote.
fn error_message(error: Value) -> Result<Value, ApiError> {
    let holds_a_message = match &error {
        Value::String(_) => true,
        Value::Object(o) => o.get("message").is_some_and(Value::is_string),
        _ => false,
    };
    if holds_a_message {
        return Ok(error);
    }
    let what = match &error {
        Value::Object(_) => "an object without a `message` string".to_owned(),
        other => format!("`{other}`"),
    };
    Err(ApiError::Validation(format!(
        "`error` is {what}: give a message (\"no such order\") or {{\"message\": \"...\", \
         \"data\": ...}}"
    )))
}

/// An answer over its body limit. Not the general advice (upload large data as a file): a
/// result has its own cap.
pub fn answer_too_large(state: &SharedState) -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "the answer is larger than a tool's result may be (tools.max_result_bytes: {} \
         bytes); answer with an error instead",
        state.config().tools.max_result_bytes
    ))
}

/// Refuses an answer whose result, or error `data`, nests deeper than a tool's result may
/// ([`MAX_TOOL_JSON_DEPTH`]): the worker could not be given it. The call still waits.
fn held_to_depth(answer: &CallerAnswer) -> Result<(), ApiError> {
    let (what, value) = match answer {
        CallerAnswer::Result(result) => ("`result`", result),
        CallerAnswer::Error(error) => match error.get("data") {
            Some(data) => ("`error.data`", data),
            None => return Ok(()),
        },
    };
    let depth = jsondepth::value_depth(value);
    if depth > MAX_TOOL_JSON_DEPTH {
        return Err(answer_too_deep(&format!(
            "the answer's {what} is nested {depth} levels deep"
        )));
    }
    Ok(())
}

/// 400 for an answer nested too deep (`what_is`: "the answer's `result` is nested 70
/// levels deep"), naming the limit; the call still waits for an answer it can take.
pub fn answer_too_deep(what_is: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "{what_is}, deeper than the {MAX_TOOL_JSON_DEPTH} levels a tool's result or error \
         data may nest (arrays and objects within one another); the call still waits for an \
         answer: send one less deep, or an error"
    ))
}

/// Cancels a run: a stateless run's worker is killed at once; a session's job is
/// interrupted (and killed if it does not stop within the grace period).
pub async fn cancel_run(
    State(state): State<SharedState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.runs.cancel(&run_id, caller.owner()) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!(
            "run '{run_id}' not found (it ended, or it is not yours)"
        )))
    }
}

#[derive(Debug, Deserialize)]
pub struct CatalogQuery {
    #[serde(default)]
    query: String,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    20
}

/// The caller's tools matching `query`, best first (every tool for an empty query).
pub async fn catalog(
    State(state): State<SharedState>,
    caller: Caller,
    Query(q): Query<CatalogQuery>,
) -> Json<Value> {
    let tools = state.catalog.search(caller.owner(), &q.query, q.limit);
    Json(json!({ "query": q.query, "tools": tools }))
}
