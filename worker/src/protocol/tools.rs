//! Host tool calls over the job socket: [`ToolCall`] up (and, for a call the program
//! stops waiting for, `WorkerMessage::ToolCancel`), [`ToolResult`] back, and the closed
//! set of ways a call can fail.

use serde::{Deserialize, Serialize};

/// One call of a host tool by user code (worker → supervisor). Hostile like every frame:
/// the supervisor checks the name, the size and the schema of the arguments again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    /// Chosen by the worker, echoed in the answer; unique within a job.
    pub id: u64,
    pub name: String,
    /// A JSON object, checked against the tool's schema.
    pub arguments: serde_json::Value,
}

/// The answer to one [`ToolCall`] (supervisor → worker).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolResult {
    pub id: u64,
    #[serde(flatten)]
    pub outcome: ToolOutcome,
}

/// What a tool call came to: the tool's JSON result, or an error the worker raises as
/// `ToolError` (or a subclass named by `kind`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolOutcome {
    Ok {
        result: serde_json::Value,
    },
    Error {
        kind: ToolErrorKind,
        message: String,
        #[serde(default)]
        data: serde_json::Value,
    },
}

impl ToolOutcome {
    pub fn error(kind: ToolErrorKind, message: impl Into<String>) -> Self {
        ToolOutcome::Error {
            kind,
            message: message.into(),
            data: serde_json::Value::Null,
        }
    }
}

/// Why a tool call failed; a closed set (it is a metrics label too).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    /// The tool ran and reported an error.
    Failed,
    /// No tool of that name is offered to this run.
    UnknownTool,
    /// The arguments do not match the tool's schema.
    InvalidArguments,
    /// A per-run limit: number of calls, argument or result size.
    Limit,
    /// No answer within the per-call timeout.
    Timeout,
    /// The run was interrupted or cancelled while the call was pending.
    Cancelled,
    /// The tool's provider could not be reached.
    Unavailable,
}

impl ToolErrorKind {
    pub const ALL: [ToolErrorKind; 7] = [
        ToolErrorKind::Failed,
        ToolErrorKind::UnknownTool,
        ToolErrorKind::InvalidArguments,
        ToolErrorKind::Limit,
        ToolErrorKind::Timeout,
        ToolErrorKind::Cancelled,
        ToolErrorKind::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorKind::Failed => "failed",
            ToolErrorKind::UnknownTool => "unknown_tool",
            ToolErrorKind::InvalidArguments => "invalid_arguments",
            ToolErrorKind::Limit => "limit",
            ToolErrorKind::Timeout => "timeout",
            ToolErrorKind::Cancelled => "cancelled",
            ToolErrorKind::Unavailable => "unavailable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{JobRequest, WorkerMessage};

    #[test]
    fn tool_calls_and_results_have_a_stable_wire_form() {
        let call: WorkerMessage = serde_json::from_str(
            r#"{"type":"tool_call","id":3,"name":"weather","arguments":{"city":"Zürich"}}"#,
        )
        .unwrap();
        let WorkerMessage::ToolCall(call) = call else {
            panic!("not a tool call")
        };
        assert_eq!((call.id, call.name.as_str()), (3, "weather"));
        let cancel = WorkerMessage::ToolCancel { id: 3 };
        assert_eq!(
            serde_json::to_value(&cancel).unwrap(),
            serde_json::json!({"type": "tool_cancel", "id": 3})
        );
        let ok = JobRequest::ToolResult(ToolResult {
            id: 3,
            outcome: ToolOutcome::Ok {
                result: serde_json::json!({"t": 21}),
            },
        });
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            serde_json::json!({"type": "tool_result", "id": 3, "status": "ok", "result": {"t": 21}})
        );
        let err = ToolResult {
            id: 4,
            outcome: ToolOutcome::error(ToolErrorKind::Limit, "too many calls"),
        };
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(
            (json["status"].as_str(), json["kind"].as_str()),
            (Some("error"), Some("limit"))
        );
        let back: ToolResult = serde_json::from_value(json).unwrap();
        assert_eq!(back, err);
        for kind in ToolErrorKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }
}
