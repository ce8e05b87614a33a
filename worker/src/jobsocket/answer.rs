//! A call's answer as it is handed to the Python half: the JSON text of a `ToolOutcome`,
//! never parsed here. The supervisor's answer is its `ToolResult` frame as it came (its
//! `type` and `id` beside the outcome's fields, which the Python half ignores), recognised
//! by reading only those two fields; the result inside is skipped over without recursion.
//!
//! So no answer, however deep, recurses on the stack of the thread that reads it, which
//! may be any thread of user code, with as little as 32 KiB (`threading.stack_size`):
//! decoding the frame into a `ToolOutcome` recursed several times per level, and an
//! answer 8 levels deep overflowed such a stack (SIGSEGV, in a debug build). It also
//! spares each answer a parse and a serialisation. What recursion remains is the Python
//! half's `json.loads`, CPython's own, as for any JSON a program reads.

use serde::Deserialize;
use serde::de::Error as _;
use snakecage_worker::frame::FrameError;
use snakecage_worker::protocol::{JobRequest, ToolOutcome};

/// The JSON text of a call's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer(String);

impl Answer {
    /// An outcome decided in the worker (a refusal, the end of the job).
    pub fn local(outcome: &ToolOutcome) -> Self {
        // An outcome made here serialises (its data is JSON already); were it ever not to,
        // the program gets a plain `ToolError` saying so.
        Self(serde_json::to_string(outcome).unwrap_or_else(|e| {
            serde_json::json!({"status": "error", "kind": "failed", "message": e.to_string()})
                .to_string()
        }))
    }

    pub fn into_json(self) -> String {
        self.0
    }

    /// The outcome, parsed (tests compare with it).
    #[cfg(test)]
    pub fn outcome(&self) -> ToolOutcome {
        serde_json::from_str(&self.0).expect("an answer is an outcome")
    }
}

#[cfg(test)]
impl PartialEq<ToolOutcome> for Answer {
    fn eq(&self, other: &ToolOutcome) -> bool {
        self.outcome() == *other
    }
}

/// A frame read from the job socket.
pub enum Frame {
    /// The answer to call `id`.
    Answer {
        id: u64,
        answer: Answer,
    },
    Request(JobRequest),
}

/// What a frame is, and only that: its other fields are skipped (serde_json skips a value
/// without recursion), so this reads a frame of any depth on any stack.
#[derive(Deserialize)]
struct Kind {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    id: Option<u64>,
}

/// Tells an answer (kept as its text) from a request (decoded).
pub fn classify(body: Vec<u8>) -> Result<Frame, FrameError> {
    if let Ok(Kind { kind, id: Some(id) }) = serde_json::from_slice::<Kind>(&body)
        && kind == "tool_result"
    {
        let text = String::from_utf8(body).map_err(|_| {
            FrameError::Malformed(serde_json::Error::custom("a tool result that is not UTF-8"))
        })?;
        return Ok(Frame::Answer {
            id,
            answer: Answer(text),
        });
    }
    Ok(Frame::Request(serde_json::from_slice(&body)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use snakecage_worker::protocol::{ToolErrorKind, ToolResult};

    fn frame(msg: &JobRequest) -> Vec<u8> {
        serde_json::to_vec(msg).unwrap()
    }

    #[test]
    fn answers_are_kept_as_text_and_requests_decoded() {
        let error = ToolOutcome::error(ToolErrorKind::Limit, "zu tief");
        let body = frame(&JobRequest::ToolResult(ToolResult {
            id: 9,
            outcome: error.clone(),
        }));
        let Ok(Frame::Answer { id, answer }) = classify(body.clone()) else {
            panic!("not an answer")
        };
        assert_eq!((id, answer.clone().into_json().into_bytes()), (9, body));
        assert_eq!(answer, error);
        assert!(matches!(
            classify(frame(&JobRequest::Inspect)),
            Ok(Frame::Request(JobRequest::Inspect))
        ));
        assert!(matches!(
            classify(b"{\"type\": \"tool_result\", \"id\": 1,".to_vec()),
            Err(FrameError::Malformed(_))
        ));
        assert_eq!(Answer::local(&error), error);
    }

    /// An answer a million levels deep is read on a thread with a 64 KiB stack.
    #[test]
    fn an_answer_of_any_depth_is_read_without_recursion() {
        let levels = 1_000_000;
        let body = format!(
            r#"{{"type":"tool_result","id":4,"status":"ok","result":{}0{}}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        );
        let len = body.len();
        let read = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || match classify(body.into_bytes()) {
                Ok(Frame::Answer { id, answer }) => (id, answer.into_json().len()),
                _ => panic!("not an answer"),
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(read, (4, len));
    }
}
