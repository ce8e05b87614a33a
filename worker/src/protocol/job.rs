//! The job socket: supervisor → worker [`JobRequest`], worker → supervisor
//! [`WorkerMessage`], and what a job is and what it came to.

use serde::{Deserialize, Serialize};

use super::{ToolCall, ToolResult};

/// Exit status of a worker that could not harden itself (never becomes Ready).
pub const EXIT_HARDENING_FAILED: i32 = 70;
/// Exit status of a worker whose job socket broke or spoke nonsense, or that could not run
/// its job (the worker's own error is on its stderr).
pub const EXIT_PROTOCOL: i32 = 71;

/// supervisor → worker.
///
/// A stateless worker takes one `Run` and exits. A worker whose first request is
/// `StartSession` keeps one `__main__` namespace and serves `Run`, `Reset` and `Inspect`
/// one at a time until its job socket closes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum JobRequest {
    Run(Job),
    /// Become a session worker (no reply).
    StartSession,
    /// Session only: forget every user global (reply: [`WorkerMessage::ResetDone`]).
    Reset,
    /// Session only: describe the user globals (reply: [`WorkerMessage::Variables`]).
    Inspect,
    /// The answer to one [`WorkerMessage::ToolCall`] of the running job, by its id. Calls
    /// are answered as each completes (or is cancelled, see
    /// [`WorkerMessage::ToolCancel`]), in any order; when the job ends with calls still
    /// pending each is answered `cancelled` after its `Result` (the worker discards an
    /// answer nobody waits for).
    ToolResult(ToolResult),
    /// Before `Ready` only, at most once: skip the tier's warm-up if it has not begun. A job
    /// started waiting for this tier after this worker was forked; it would wait for the
    /// warm-up and then pay its own run on top.
    SkipWarmUp,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Job {
    /// The source to run as `__main__.py`; empty when `entrypoint` is set.
    pub code: String,
    pub stdin: Option<String>,
    pub last_line_interactive: bool,
    /// A file in the workspace (relative path) to run as `__main__` instead of `code`,
    /// like `python <entrypoint> <args>`.
    #[serde(default)]
    pub entrypoint: Option<String>,
    /// `sys.argv[1:]` for an `entrypoint`.
    #[serde(default)]
    pub args: Vec<String>,
    /// The largest rich-output bundle (all its MIME entries together) the runner reports;
    /// a bigger one is replaced by a note. 0: the runner's default.
    #[serde(default)]
    pub max_bundle_bytes: u64,
    /// The job's time limit, set by the run that sends it: the runner's own work after the
    /// program (drawing the figures it left open) stops short of it, so the result gets
    /// out before the deadline kills the worker. 0: none.
    #[serde(default)]
    pub timeout_ms: u64,
    /// The tools `snakecage.tools` offers this job (Code Mode); empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<crate::toolspec::ToolSpec>,
    /// How many tool calls of this job may be in flight at once
    /// (`tools.max_concurrent_calls`): the worker holds a call past it until one answers,
    /// and the supervisor kills a worker that sends more. 0 (an older sender) counts as 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub max_concurrent_tool_calls: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Job {
    /// [`Job::max_concurrent_tool_calls`], at least 1.
    pub fn tool_call_cap(&self) -> usize {
        self.max_concurrent_tool_calls.max(1) as usize
    }
}

/// worker → supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    /// Hardened, waiting for its job; `warmed`: the tier's warm-up ran (it is skipped when a
    /// job was already waiting, see [`JobRequest::SkipWarmUp`]).
    Ready { warmed: bool },
    /// The job ran to an end the worker could report (any exit code).
    Result(JobResult),
    /// A session's globals were cleared.
    ResetDone,
    /// A session's user globals: the first of them described, and how many there are.
    Variables {
        variables: Vec<Variable>,
        /// Every user global, listed or not (an older worker: 0, read as the list's length).
        #[serde(default)]
        total: u64,
    },
    /// The running job calls a host tool; the calling thread waits for the
    /// [`JobRequest::ToolResult`] of the same id. Up to [`Job::max_concurrent_tool_calls`]
    /// calls may be in flight at once, each with its own id.
    ToolCall(ToolCall),
    /// The program stopped waiting for call `id` (an asyncio task awaiting it was
    /// cancelled): the supervisor drops the call and answers it `cancelled`, which frees
    /// its slot. A cancel of an id not pending (answered already: a natural race) is
    /// ignored; no id is ever answered twice.
    ToolCancel { id: u64 },
}

/// One rich output, like a Jupyter `display_data`: MIME type ⇒ content (text, or base64
/// for binary types such as `image/png`).
pub type MimeBundle = std::collections::BTreeMap<String, String>;

/// A session global as `GET /v1/sessions/{id}` lists it: bounded, never the value itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Variable {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// A short repr, cut to a fixed length.
    pub repr: String,
    /// For arrays and DataFrames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
}

/// What the runner reports about one job; output is not in here (it went to fd 1/2).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobResult {
    pub exit_code: i32,
    /// The job hit its memory limit: an uncaught `MemoryError`, or no memory left to
    /// report its rich outputs (dropped for a note).
    pub memory_error: bool,
    pub error: Option<ErrorInfo>,
    /// Rich outputs in the order produced: `display()` calls, the last expression's value,
    /// then matplotlib figures left open.
    #[serde(default)]
    pub results: Vec<MimeBundle>,
}

/// The uncaught exception of a job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorInfo {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_without_entrypoint_fields_still_decodes() {
        let job: Job =
            serde_json::from_str(r#"{"code":"1","stdin":null,"last_line_interactive":true}"#)
                .unwrap();
        assert_eq!((job.entrypoint, job.args.len()), (None, 0));
    }

    #[test]
    fn session_requests_and_replies_have_a_stable_wire_form() {
        let json = serde_json::to_value(JobRequest::StartSession).unwrap();
        assert_eq!(json, serde_json::json!({"type": "start_session"}));
        let msg: WorkerMessage = serde_json::from_str(
            r#"{"type":"variables","variables":[{"name":"x","type":"int","repr":"42"}]}"#,
        )
        .unwrap();
        let WorkerMessage::Variables { variables, total } = msg else {
            panic!("not variables")
        };
        assert_eq!(
            (
                variables[0].kind.as_str(),
                variables[0].shape.clone(),
                total
            ),
            ("int", None, 0)
        );
        // Results without rich outputs (an older worker) still decode.
        let r: JobResult =
            serde_json::from_str(r#"{"exit_code":0,"memory_error":false,"error":null}"#).unwrap();
        assert!(r.results.is_empty());
    }

    #[test]
    fn an_unknown_message_type_is_rejected() {
        let err = serde_json::from_str::<WorkerMessage>(r#"{"type":"root_shell"}"#);
        assert!(err.is_err());
    }
}
