//! An upstream's message too large to read, as the answer to the one call it was for.
//!
//! Both transports bound what they read of one message (a stdio line, an HTTP body or SSE
//! event) so that a server cannot make snakecage hold an unbounded answer. Left to rmcp, a
//! message past its bound is dropped (stdio: the call then waits for its timeout) or ends
//! the call as if the connection were lost (HTTP). Instead, the transport hands rmcp this
//! JSON-RPC error in its place, with the call's id, and [`Upstream::call`] turns it into the
//! same `limit` error a result over `tools.max_result_bytes` gets: one call fails, at once,
//! and the link and every other call on it go on.
//!
//! [`Upstream::call`]: super::Upstream::call

use rmcp::model::{ErrorCode, ErrorData, RequestId, ServerJsonRpcMessage};
use serde_json::{Value, json};

/// Room for what a message carries besides a result: the JSON-RPC envelope, the MCP
/// result's fields, SSE field names.
const FRAMING_BYTES: usize = 64 << 10;

/// The data key that marks the error as this one. A server could send it too; it would
/// only fail its own call with a `limit` error, which it can do anyway.
const MARKER: &str = "snakecage/messageTooLarge";

/// The most bytes read of one message from an upstream MCP server that answers results of
/// at most `max_result_bytes`: twice that, because a tool that returns structured content
/// should also return it serialized as text (MCP's tools/call), plus framing.
pub fn message_limit(max_result_bytes: usize) -> usize {
    max_result_bytes
        .saturating_mul(2)
        .saturating_add(FRAMING_BYTES)
}

/// The answer to call `id` whose message was over `limit` bytes and was not read.
pub fn answer(id: RequestId, limit: usize) -> ServerJsonRpcMessage {
    ServerJsonRpcMessage::error(
        ErrorData::new(
            ErrorCode::INTERNAL_ERROR,
            "the answer was too large to read",
            Some(json!({ MARKER: limit })),
        ),
        Some(id),
    )
}

/// The limit an answer from [`answer`] names; `None` for any other error.
pub fn limit_of(error: &ErrorData) -> Option<usize> {
    let limit = error.data.as_ref()?.get(MARKER).and_then(Value::as_u64)?;
    usize::try_from(limit).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;

    #[test]
    fn the_answer_names_its_limit_and_other_errors_do_not() {
        let ServerJsonRpcMessage::Error(error) = answer(NumberOrString::Number(7), 1234) else {
            panic!("not an error");
        };
        assert_eq!(error.id, Some(NumberOrString::Number(7)));
        assert_eq!(limit_of(&error.error), Some(1234));
        let other = ErrorData::internal_error("boom", Some(json!({"limit": 1})));
        assert_eq!(limit_of(&other), None);
        assert_eq!(limit_of(&ErrorData::internal_error("boom", None)), None);
    }
}
