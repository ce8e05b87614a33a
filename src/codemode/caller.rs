//! Tools a request declares (`tools` in an execute body), answered by its own client: on
//! `/v1/execute/stream` each call becomes an SSE `tool_call` event, and the client
//! answers with `POST /v1/runs/{run_id}/tool_calls/{call_id}`. A call the client was
//! told of that is cancelled before its answer comes (see [`CancelCause`]) becomes one
//! `tool_call_cancelled` event, so that the client stops working on it. Three shapes are
//! accepted: plain `{name, description, parameters}`, OpenAI's
//! `{type: "function", function: {...}}` and Anthropic's `{name, description,
//! input_schema}`.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::{ToolSpec, empty_object_schema, valid_name};
use tokio::sync::mpsc;

use super::catalog::failed;
use crate::pool::cancel_cause::{self, CancelCause};
use crate::runs::{CallerAnswer, RunEntry};

/// What the client is sent for each call (the SSE `tool_call` event).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallEvent {
    pub run_id: String,
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
}

/// What the client is sent for a call of which it was told, cancelled before its answer
/// came (the SSE `tool_call_cancelled` event).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallCancelled {
    pub run_id: String,
    pub call_id: String,
    pub name: String,
    /// [`CancelCause::as_str`].
    pub reason: &'static str,
    /// [`CancelCause::describe`].
    pub message: &'static str,
}

/// Where a run's caller-tool events go: its calls, each waiting for room (a slow client
/// slows the calls), and their cancellations, never waiting (they are sent as a call's
/// future is dropped; there is at most one per call, and a run makes at most
/// `tools.max_calls_per_run` calls).
#[derive(Clone)]
pub struct CallerEvents {
    calls: mpsc::Sender<ToolCallEvent>,
    cancelled: mpsc::UnboundedSender<ToolCallCancelled>,
}

/// The receiving ends of [`CallerEvents`], for the run's stream.
pub struct CallerEventsRx {
    pub calls: mpsc::Receiver<ToolCallEvent>,
    pub cancelled: mpsc::UnboundedReceiver<ToolCallCancelled>,
}

/// A run's caller-tool events, `buffer` of its calls buffered for a slow client.
pub fn caller_events(buffer: usize) -> (CallerEvents, CallerEventsRx) {
    let (calls, calls_rx) = mpsc::channel(buffer);
    let (cancelled, cancelled_rx) = mpsc::unbounded_channel();
    (
        CallerEvents { calls, cancelled },
        CallerEventsRx {
            calls: calls_rx,
            cancelled: cancelled_rx,
        },
    )
}

/// Reads the declared tools, in order; the message says which one is wrong and why.
pub fn parse_declared(tools: &[Value], max: usize) -> Result<Vec<ToolSpec>, String> {
    if tools.len() > max {
        return Err(format!(
            "a request may declare at most {max} tools (tools.max_caller_tools); it declares {}",
            tools.len()
        ));
    }
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let object = tool.as_object().ok_or_else(|| {
            format!("{at} must be an object with name, description and parameters")
        })?;
        // OpenAI nests the function; Anthropic calls the schema input_schema.
        let inner = match object.get("type").and_then(Value::as_str) {
            Some("function") => object
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    format!("{at}: type is \"function\" but there is no function object")
                })?,
            _ => object,
        };
        let name = inner
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{at}: name (a string) is required"))?;
        if !valid_name(name) {
            return Err(format!(
                "{at}: tool name {name:?} must be 1-64 ASCII letters, digits, '_', '-' or '.'"
            ));
        }
        if specs.iter().any(|s| s.name == name) {
            return Err(format!("{at}: tool name '{name}' is declared twice"));
        }
        let description = match inner.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(format!("{at}: description must be a string")),
        };
        let parameters = inner
            .get("parameters")
            .or_else(|| inner.get("input_schema"))
            .cloned()
            .unwrap_or_else(empty_object_schema);
        if !parameters.is_object() {
            return Err(format!("{at}: parameters must be a JSON Schema object"));
        }
        if let Err(e) = jsonschema::validator_for(&parameters) {
            return Err(format!(
                "{at}: parameters of '{name}' are not a valid JSON Schema: {e}"
            ));
        }
        specs.push(ToolSpec {
            name: name.to_owned(),
            description,
            parameters,
        });
    }
    Ok(specs)
}

/// Carries one run's calls of declared tools to its client and back.
pub struct CallerBridge {
    run: Arc<RunEntry>,
    events: CallerEvents,
}

impl CallerBridge {
    pub fn new(run: Arc<RunEntry>, events: CallerEvents) -> Self {
        Self { run, events }
    }

    pub async fn call(&self, name: &str, arguments: Value) -> ToolOutcome {
        let mut pending = self.run.expect_answer();
        let event = ToolCallEvent {
            run_id: self.run.id.clone(),
            call_id: pending.call_id.clone(),
            name: name.to_owned(),
            arguments,
        };
        if self.events.calls.send(event).await.is_err() {
            return ToolOutcome::error(
                ToolErrorKind::Unavailable,
                "the client that declared this tool is gone",
            );
        }
        // The client knows of the call now: dropped before its answer comes, it is told.
        let mut told = Told {
            bridge: self,
            call_id: &pending.call_id,
            name,
            answered: false,
        };
        let answer = (&mut pending.answer).await;
        told.answered = answer.is_ok();
        drop(told);
        match answer {
            Ok(CallerAnswer::Result(result)) => ToolOutcome::Ok { result },
            Ok(CallerAnswer::Error(error)) => {
                let message = match &error {
                    Value::String(s) => s.clone(),
                    Value::Object(o) => o
                        .get("message")
                        .and_then(Value::as_str)
                        .map_or_else(|| error.to_string(), str::to_owned),
                    other => other.to_string(),
                };
                let data = match &error {
                    Value::Object(o) => o.get("data").cloned().unwrap_or(Value::Null),
                    _ => Value::Null,
                };
                failed(message, data)
            }
            Err(_) => ToolOutcome::error(ToolErrorKind::Cancelled, "the run ended"),
        }
    }
}

/// A call its client was told of, until its answer comes. Dropped before (the call's
/// future was dropped: cancelled), it cancels the call in the run with the cause of the
/// drop, which refuses a later answer saying why, and sends the client a
/// `tool_call_cancelled` event, unless the answer came first.
struct Told<'a> {
    bridge: &'a CallerBridge,
    call_id: &'a str,
    name: &'a str,
    answered: bool,
}

impl Drop for Told<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // Every cancel says why (`pool::cancel_cause`); a drop no cancel explains is one
        // of a run that was dropped.
        let cause = cancel_cause::current().unwrap_or(CancelCause::RunAbandoned);
        if self.bridge.run.cancel_call(self.call_id, cause) {
            // A client gone meanwhile reads no more events.
            let _ = self.bridge.events.cancelled.send(ToolCallCancelled {
                run_id: self.bridge.run.id.clone(),
                call_id: self.call_id.to_owned(),
                name: self.name.to_owned(),
                reason: cause.as_str(),
                message: cause.describe(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_three_shapes_give_the_same_spec() {
        let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let plain = json!({"name": "find", "description": "Find", "parameters": schema});
        let openai = json!({"type": "function", "function": {"name": "find", "description": "Find", "parameters": schema}});
        let anthropic = json!({"name": "find", "description": "Find", "input_schema": schema});
        for shape in [plain, openai, anthropic] {
            let specs = parse_declared(&[shape], 8).unwrap();
            assert_eq!(specs[0].name, "find");
            assert_eq!(specs[0].parameters, schema);
        }
    }

    #[test]
    fn bad_declarations_say_what_is_wrong() {
        let err = |v: Value| parse_declared(&[v], 8).unwrap_err();
        assert!(err(json!({"description": "x"})).contains("name (a string) is required"));
        assert!(err(json!({"name": "a b"})).contains("must be 1-64"));
        assert!(err(json!({"name": "a", "parameters": 3})).contains("JSON Schema object"));
        assert!(
            err(json!({"name": "a", "parameters": {"type": "nonsense"}}))
                .contains("not a valid JSON Schema")
        );
        assert!(err(json!({"type": "function"})).contains("no function object"));
        let twice = parse_declared(&[json!({"name": "a"}), json!({"name": "a"})], 8).unwrap_err();
        assert!(twice.contains("declared twice"));
        assert!(
            parse_declared(&[json!({"name": "a"}), json!({"name": "b"})], 1)
                .unwrap_err()
                .contains("at most 1")
        );
    }
}
