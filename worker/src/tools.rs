//! `_snakecage_tools`: the native half of `snakecage.tools` (Code Mode). It holds the
//! tools offered to the current job, searches them, checks a call's arguments against the
//! tool's JSON Schema, and carries the call over the job socket: a `ToolCall` frame out,
//! then a blocking read of the `ToolResult` frame with the same id. The Python half
//! (`python/tools.py`) turns answers into return values and exceptions.
//!
//! Nothing here is trusted by the supervisor: it checks every call again. The checks here
//! give user code a clear exception before anything is sent.
//!
//! The offered tools are the process's, not a thread's: a program fans its calls out over
//! `threading` or a `ThreadPoolExecutor` as readily as it loops. Calls still go over the
//! job socket one at a time (the supervisor answers one pending call per run): a call holds
//! the GIL from its check to its answer, and the worker's own job loop holds it whenever it
//! reads or writes the socket, so no two frames ever interleave. The tools are withdrawn
//! when the job ends: a thread that outlives its job (in a session) finds none until the
//! next job, and then only that job's.

use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde_json::Value;
use snakecage_worker::frame::{self, MAX_FRAME_LEN};
use snakecage_worker::protocol::{JobRequest, ToolCall, ToolErrorKind, ToolOutcome, WorkerMessage};
use snakecage_worker::toolspec::{self, ToolSpec};

use crate::sandbox::fds;

/// The most schema violations one exception lists.
const MAX_REPORTED_VIOLATIONS: usize = 5;

struct Offered {
    spec: ToolSpec,
    /// `None` when the schema does not compile here; the supervisor still checks.
    validator: Option<jsonschema::Validator>,
}

#[derive(Default)]
struct State {
    tools: Vec<Offered>,
    next_id: u64,
}

/// The current job's tools, seen from every thread of the worker.
static STATE: Mutex<State> = Mutex::new(State {
    tools: Vec::new(),
    next_id: 0,
});

/// The state; a panic elsewhere while it was held leaves nothing half-written in it.
fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Offers `tools` to the job about to run (each job of a session brings its own).
pub fn offer(tools: &[ToolSpec]) {
    state().tools = tools
        .iter()
        .map(|spec| Offered {
            validator: jsonschema::validator_for(&spec.parameters).ok(),
            spec: spec.clone(),
        })
        .collect();
}

/// Withdraws the tools of the job that just ended: until the next job offers its own,
/// every call is refused unsent (nothing may reach the socket between jobs).
pub fn withdraw() {
    state().tools.clear();
}

/// The module, to be placed in `sys.modules` as `_snakecage_tools`.
pub fn native_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let module = PyModule::new(py, "_snakecage_tools")?;
    module.add_function(wrap_pyfunction!(catalog, &module)?)?;
    module.add_function(wrap_pyfunction!(search, &module)?)?;
    module.add_function(wrap_pyfunction!(call, &module)?)?;
    Ok(module)
}

/// Every offered tool, as a JSON list of `{name, description, parameters}`.
#[pyfunction]
fn catalog() -> String {
    let state = state();
    let specs: Vec<&ToolSpec> = state.tools.iter().map(|t| &t.spec).collect();
    serde_json::to_string(&specs).unwrap_or_else(|_| "[]".into())
}

/// The offered tools matching `query`, best first, as a JSON list.
#[pyfunction]
fn search(query: &str, limit: usize) -> String {
    let specs: Vec<ToolSpec> = state().tools.iter().map(|t| t.spec.clone()).collect();
    let found: Vec<&ToolSpec> = toolspec::search(&specs, query, limit)
        .into_iter()
        .map(|i| &specs[i])
        .collect();
    serde_json::to_string(&found).unwrap_or_else(|_| "[]".into())
}

/// Calls `name` with `arguments` (a JSON object); returns the JSON of the outcome
/// (`{"status": "ok", "result"}` or `{"status": "error", "kind", "message", "data"}`).
/// An unknown tool or arguments that fail the schema are answered here, unsent.
#[pyfunction]
fn call(name: &str, arguments: &str) -> PyResult<String> {
    let outcome = match prepare(name, arguments) {
        Ok((id, arguments)) => send(id, name, arguments)?,
        Err(refused) => refused,
    };
    serde_json::to_string(&outcome).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

fn prepare(name: &str, arguments: &str) -> Result<(u64, Value), ToolOutcome> {
    let arguments: Value = serde_json::from_str(arguments).map_err(|e| {
        ToolOutcome::error(
            ToolErrorKind::InvalidArguments,
            format!("the arguments are not JSON: {e}"),
        )
    })?;
    let mut state = state();
    let Some(tool) = state.tools.iter().find(|t| t.spec.name == name) else {
        return Err(unknown(name, &state.tools));
    };
    if let Some(validator) = &tool.validator {
        let problems: Vec<String> = validator
            .iter_errors(&arguments)
            .take(MAX_REPORTED_VIOLATIONS)
            .map(|e| describe_violation(&e.instance_path().to_string(), &e.to_string()))
            .collect();
        if !problems.is_empty() {
            return Err(ToolOutcome::error(
                ToolErrorKind::InvalidArguments,
                format!(
                    "arguments of tool '{name}' do not match its schema: {}",
                    problems.join("; ")
                ),
            ));
        }
    }
    state.next_id += 1;
    Ok((state.next_id, arguments))
}

/// One schema violation, located: `city: 3 is not of type "string"`.
pub fn describe_violation(path: &str, message: &str) -> String {
    let at = path.trim_start_matches('/');
    if at.is_empty() {
        message.to_owned()
    } else {
        format!("{}: {message}", at.replace('/', "."))
    }
}

fn unknown(name: &str, tools: &[Offered]) -> ToolOutcome {
    let known: Vec<&str> = tools
        .iter()
        .map(|t| t.spec.name.as_str())
        .take(20)
        .collect();
    let message = if known.is_empty() {
        format!("unknown tool '{name}': this run has no tools")
    } else {
        format!(
            "unknown tool '{name}'; this run offers: {} (tools.search(query) finds them by purpose)",
            known.join(", ")
        )
    };
    ToolOutcome::error(ToolErrorKind::UnknownTool, message)
}

/// Sends the call and blocks until its answer. The GIL stays held (see the module docs):
/// the program waits for the tool, calls from several threads go out one at a time, and
/// the job loop cannot read or write the socket meanwhile.
fn send(id: u64, name: &str, arguments: Value) -> PyResult<ToolOutcome> {
    // SAFETY: fd 3 is the job socket placed by `fds::arrange` and open for the life of the
    // process; ManuallyDrop keeps this File from closing it.
    let mut sock = ManuallyDrop::new(unsafe { File::from_raw_fd(fds::JOB_FD) });
    let broken = |what: String| PyRuntimeError::new_err(format!("the tool channel broke: {what}"));
    let message = WorkerMessage::ToolCall(ToolCall {
        id,
        name: name.to_owned(),
        arguments,
    });
    frame::write_frame(&mut *sock, &message).map_err(|e| broken(e.to_string()))?;
    match frame::read_frame::<_, JobRequest>(&mut *sock, MAX_FRAME_LEN) {
        Ok(Some(JobRequest::ToolResult(answer))) if answer.id == id => Ok(answer.outcome),
        Ok(Some(_)) => Err(broken("an unexpected answer".into())),
        Ok(None) => Err(broken("the supervisor hung up".into())),
        Err(e) => Err(broken(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_name_the_argument() {
        assert_eq!(
            describe_violation("/city", "3 is not of type \"string\""),
            "city: 3 is not of type \"string\""
        );
        assert_eq!(describe_violation("", "x"), "x");
        assert_eq!(describe_violation("/a/0", "m"), "a.0: m");
    }

    #[test]
    fn unknown_tools_and_bad_arguments_are_refused_before_sending() {
        offer(&[ToolSpec {
            name: "weather".into(),
            description: "d".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"]
            }),
        }]);
        let Err(ToolOutcome::Error { kind, message, .. }) = prepare("nope", "{}") else {
            panic!("an unknown tool went through")
        };
        assert_eq!(kind, ToolErrorKind::UnknownTool);
        assert!(message.contains("weather"), "{message}");
        let Err(ToolOutcome::Error { kind, message, .. }) = prepare("weather", r#"{"city": 3}"#)
        else {
            panic!("bad arguments went through")
        };
        assert_eq!(kind, ToolErrorKind::InvalidArguments);
        assert!(message.contains("city: 3 is not of type"), "{message}");
        let (first, _) = prepare("weather", r#"{"city": "Zürich"}"#).unwrap();
        // Another thread sees the same tools (a program's threads fan calls out).
        let (second, _) = std::thread::spawn(|| prepare("weather", r#"{"city": "Bern"}"#))
            .join()
            .unwrap()
            .unwrap();
        assert_eq!(second, first + 1);
        // Once the job ends, no thread may call them.
        withdraw();
        let Err(ToolOutcome::Error { kind, message, .. }) =
            std::thread::spawn(|| prepare("weather", r#"{"city": "Chur"}"#))
                .join()
                .unwrap()
        else {
            panic!("a withdrawn tool went through")
        };
        assert_eq!(kind, ToolErrorKind::UnknownTool);
        assert!(message.contains("this run has no tools"), "{message}");
    }
}
