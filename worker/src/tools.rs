//! `_snakecage_tools`: the native half of `snakecage.tools` (Code Mode). It holds the
//! tools offered to the current job, searches them, checks a call's arguments against the
//! tool's JSON Schema, and carries the call over the job socket: a `ToolCall` frame out,
//! then a wait for the `ToolResult` frame with the same id. The Python half
//! (`python/tools.py`) turns answers into return values and exceptions.
//!
//! Nothing here is trusted by the supervisor: it checks every call again. The checks here
//! give user code a clear exception before anything is sent.
//!
//! The offered tools are the process's, not a thread's, and calls run concurrently: a
//! program fans its calls out over `threading`, a `ThreadPoolExecutor` or asyncio
//! (`tools.acall`, which runs calls on a small pool of threads) as readily as it loops.
//! A call releases the GIL from the moment its arguments are checked until its answer is
//! there, so the program's other threads run meanwhile, and several calls, each with its
//! own id, are in flight at once. The job socket is shared with the job loop
//! ([`crate::jobsocket`]): one write lock for every frame, and one reader at a time that
//! hands each answer to the thread waiting for its id.
//!
//! Per job, at most [`Job::max_concurrent_tool_calls`] calls are in flight (the
//! supervisor kills a worker that sends more): a call past the cap waits, GIL released,
//! for a free slot. The tools are withdrawn when the job ends, under the write lock, so
//! no `ToolCall` frame can follow the job's `Result`: every call still in flight, or
//! waiting for a slot, is answered `cancelled` here and wakes up (the supervisor's own
//! answers to them, sent after the `Result`, are discarded). A thread that outlives its
//! job (in a session) finds no tools until the next job, and then only that job's.
//!
//! An asyncio call (`tools.acall`) is made in two steps, so that it can be cancelled: the
//! event loop's thread checks it and gets a ticket ([`cancel`]), a thread of the module's
//! pool sends it and waits; a task that stops waiting cancels the ticket.
//!
//! [`Job::max_concurrent_tool_calls`]: snakecage_worker::protocol::Job::max_concurrent_tool_calls

mod cancel;

use std::sync::{Condvar, Mutex, MutexGuard};

use pyo3::exceptions::{PyMemoryError, PyRuntimeError};
use pyo3::prelude::*;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use snakecage_worker::frame;
use snakecage_worker::jsondepth::{self, MAX_TOOL_JSON_DEPTH};
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::{self, ToolSpec};

use self::cancel::{Cancellable, Progress};
use crate::jobsocket::{Answer, JOB, JobSocket};

/// The most schema violations one exception lists.
const MAX_REPORTED_VIOLATIONS: usize = 5;

struct Offered {
    spec: ToolSpec,
    /// `None` when the schema does not compile here; the supervisor still checks.
    validator: Option<jsonschema::Validator>,
}

struct State {
    tools: Vec<Offered>,
    /// Which job the tools belong to: changed by every offer and withdrawal, so a call
    /// checked during one job is never sent during another.
    job: u64,
    /// Calls of this job in flight at most, and now (a slot is taken before the frame
    /// goes out and given back once the answer is in).
    cap: usize,
    in_flight: usize,
    /// Calls waiting for a slot (tests look).
    #[cfg_attr(not(test), allow(dead_code))]
    waiting_for_slot: usize,
    next_id: u64,
}

/// The tools of the current job and their calls over one job socket.
pub struct Tools {
    state: Mutex<State>,
    /// Signalled when a slot is given back or the job ends.
    slot_freed: Condvar,
    socket: &'static JobSocket,
}

/// The current job's tools, seen from every thread of the worker.
static TOOLS: Tools = Tools::new(&JOB);

/// A call checked against the tools of job `job`, to be sent.
struct Checked {
    job: u64,
    name: String,
    /// As user code's JSON had them: sent as they are, never serialised from a value
    /// (which recursed on the stack of the thread sending).
    arguments: Box<RawValue>,
}

/// A `ToolCall` frame as the worker writes it: the arguments' JSON as it is (the
/// supervisor reads it as a `WorkerMessage::ToolCall`).
#[derive(Serialize)]
#[serde(tag = "type", rename = "tool_call")]
struct CallFrame<'a> {
    id: u64,
    name: &'a str,
    arguments: &'a RawValue,
}

/// The stack that checking arguments `depth` levels deep may take (parsing, validating and
/// dropping recurse per level; a debug build takes the most), generously.
fn check_stack_bytes(depth: usize) -> usize {
    (64 + 4 * depth) * 1024
}

/// Offers `tools` to the job about to run (each job of a session brings its own), with at
/// most `cap` calls in flight at once.
pub fn offer(tools: &[ToolSpec], cap: usize) {
    TOOLS.offer(tools, cap);
}

/// Withdraws the tools of the job that just ended (see the module docs).
pub fn withdraw() {
    TOOLS.withdraw();
}

/// The module, to be placed in `sys.modules` as `_snakecage_tools`.
pub fn native_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let module = PyModule::new(py, "_snakecage_tools")?;
    module.add_function(wrap_pyfunction!(catalog, &module)?)?;
    module.add_function(wrap_pyfunction!(search, &module)?)?;
    module.add_function(wrap_pyfunction!(call, &module)?)?;
    module.add_function(wrap_pyfunction!(max_concurrent_calls, &module)?)?;
    module.add("MAX_JSON_DEPTH", MAX_TOOL_JSON_DEPTH)?;
    cancel::add_to(&module)?;
    Ok(module)
}

/// Every offered tool, as a JSON list of `{name, description, parameters}`.
#[pyfunction]
fn catalog() -> String {
    let state = TOOLS.state();
    let specs: Vec<&ToolSpec> = state.tools.iter().map(|t| &t.spec).collect();
    serde_json::to_string(&specs).unwrap_or_else(|_| "[]".into())
}

/// The offered tools matching `query`, best first, as a JSON list.
#[pyfunction]
fn search(query: &str, limit: usize) -> String {
    let specs: Vec<ToolSpec> = TOOLS.state().tools.iter().map(|t| t.spec.clone()).collect();
    let found: Vec<&ToolSpec> = toolspec::search(&specs, query, limit)
        .into_iter()
        .map(|i| &specs[i])
        .collect();
    serde_json::to_string(&found).unwrap_or_else(|_| "[]".into())
}

/// How many calls of the current job may be in flight at once (the last job's between
/// jobs): what `tools.acall` sizes its thread pool to.
#[pyfunction]
fn max_concurrent_calls() -> usize {
    TOOLS.state().cap
}

/// Calls `name` with `arguments` (a JSON object); returns the JSON of the outcome
/// (`{"status": "ok", "result"}` or `{"status": "error", "kind", "message", "data"}`).
/// An unknown tool or arguments that fail the schema are answered here, unsent. The wait
/// for a slot and for the answer runs with the GIL released.
#[pyfunction]
fn call(py: Python<'_>, name: &str, arguments: &str) -> PyResult<String> {
    memory_for_a_call()?;
    let answer = match TOOLS.check(name, arguments) {
        Ok(checked) => py
            .detach(|| TOOLS.send(checked, None))
            .map_err(channel_broke)?,
        Err(refused) => Answer::local(&refused),
    };
    Ok(answer.into_json())
}

/// `MemoryError` unless the allocator's reserve is there (mapped again if a failed
/// allocation spent it): a call runs Rust, whose allocations abort the worker when they
/// fail, so none starts in a job whose memory is used up (see [`crate::reserve`]).
fn memory_for_a_call() -> PyResult<()> {
    crate::reserve::ensure().map_err(|e| PyMemoryError::new_err(e.to_string()))
}

fn channel_broke(what: String) -> PyErr {
    PyRuntimeError::new_err(format!("the tool channel broke: {what}"))
}

/// What a call still in flight, or waiting for a slot, gets when its job ends.
fn run_ended() -> ToolOutcome {
    ToolOutcome::error(
        ToolErrorKind::Cancelled,
        "the run ended while this call was pending",
    )
}

impl Tools {
    const fn new(socket: &'static JobSocket) -> Self {
        Self {
            state: Mutex::new(State {
                tools: Vec::new(),
                job: 0,
                cap: 1,
                in_flight: 0,
                waiting_for_slot: 0,
                next_id: 0,
            }),
            slot_freed: Condvar::new(),
            socket,
        }
    }

    /// The state; a panic elsewhere while it was held leaves nothing half-written in it.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn offer(&self, tools: &[ToolSpec], cap: usize) {
        let mut state = self.state();
        state.tools = tools
            .iter()
            .map(|spec| Offered {
                validator: jsonschema::validator_for(&spec.parameters).ok(),
                spec: spec.clone(),
            })
            .collect();
        state.job += 1;
        state.cap = cap.max(1);
        state.in_flight = 0;
    }

    /// Until the next job offers its own, every call is refused unsent; the calls in
    /// flight and those waiting for a slot are answered `cancelled`. Under the write lock:
    /// a call checked before this either went out before it, or never goes.
    fn withdraw(&self) {
        let _writer = self.socket.writer();
        {
            let mut state = self.state();
            state.tools.clear();
            state.job += 1;
            state.in_flight = 0;
        }
        self.slot_freed.notify_all();
        self.socket.answer_all_locally(&run_ended());
    }

    /// Checks a call on a stack that can hold the work: this thread's, or a helper's when
    /// user code gave this thread a small one ([`crate::stack`]).
    fn check(&self, name: &str, arguments: &str) -> Result<Checked, ToolOutcome> {
        let depth = too_deep(name, arguments)?;
        crate::stack::with_room(check_stack_bytes(depth), || {
            self.check_here(name, arguments)
        })
        .unwrap_or_else(|e| {
            Err(ToolOutcome::error(
                ToolErrorKind::Limit,
                format!(
                    "tool '{name}' was not called: this thread's stack is too small to check \
                     its arguments, and no thread with a larger one could be started ({e})"
                ),
            ))
        })
    }

    fn check_here(&self, name: &str, text: &str) -> Result<Checked, ToolOutcome> {
        let arguments: Value = serde_json::from_str(text).map_err(|e| {
            ToolOutcome::error(
                ToolErrorKind::InvalidArguments,
                format!("the arguments are not JSON: {e}"),
            )
        })?;
        let state = self.state();
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
        // JSON, parsed just above: its text is taken as it is (skimmed, without recursion).
        let arguments = RawValue::from_string(text.to_owned()).map_err(|e| {
            ToolOutcome::error(
                ToolErrorKind::InvalidArguments,
                format!("the arguments are not JSON: {e}"),
            )
        })?;
        Ok(Checked {
            job: state.job,
            name: name.to_owned(),
            arguments,
        })
    }

    /// Sends a checked call and waits for its answer: first for a slot, then for the
    /// answer. Blocks: call it with the GIL released. `Err`: the job socket broke. A call
    /// `cancellable` stops waiting for a slot when cancelled, and is then never sent.
    fn send(&self, call: Checked, cancellable: Option<&Cancellable>) -> Result<Answer, String> {
        let job = call.job;
        let cancelled = || cancellable.is_some_and(Cancellable::is_cancelled);
        let id = {
            let mut state = self.state();
            state.waiting_for_slot += 1;
            while state.job == job && state.in_flight >= state.cap && !cancelled() {
                state = self
                    .slot_freed
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            state.waiting_for_slot -= 1;
            if state.job != job {
                return Ok(Answer::local(&run_ended()));
            }
            if cancelled() {
                return Ok(Answer::local(&cancel::stopped_waiting()));
            }
            state.in_flight += 1;
            state.next_id += 1;
            state.next_id
        };
        let answered = self.send_in_slot(id, call, cancellable);
        let mut state = self.state();
        if state.job == job {
            state.in_flight -= 1;
            drop(state);
            self.slot_freed.notify_all();
        }
        answered
    }

    fn send_in_slot(
        &self,
        id: u64,
        call: Checked,
        cancellable: Option<&Cancellable>,
    ) -> Result<Answer, String> {
        let message = CallFrame {
            id,
            name: &call.name,
            arguments: &call.arguments,
        };
        let bytes = frame::encode(&message).map_err(|e| e.to_string())?;
        {
            let mut writer = self.socket.writer();
            // Still this job's, under the lock `withdraw` takes: nothing of a job that has
            // ended goes out.
            if self.state().job != call.job {
                return Ok(Answer::local(&run_ended()));
            }
            // Under the write lock, which a cancel takes too: either it finds the call
            // sent, or the call finds it cancelled and is not sent.
            if let Some(cancellable) = cancellable {
                let mut progress = cancellable.progress();
                if *progress == Progress::Cancelled {
                    return Ok(Answer::local(&cancel::stopped_waiting()));
                }
                *progress = Progress::Sent { job: call.job, id };
            }
            self.socket.expect(&writer, id);
            if let Err(e) = writer.send_encoded(&bytes) {
                self.socket.forget(id);
                return Err(e.to_string());
            }
        }
        self.socket.wait_answer(id).map_err(|e| e.to_string())
    }
}

/// Refuses `arguments` (JSON text) nesting an argument deeper than a tool call may: measured
/// before it is parsed, so arguments deeper than the parser goes are measured too. `Ok`:
/// how deep the arguments nest, their object included.
fn too_deep(name: &str, arguments: &str) -> Result<usize, ToolOutcome> {
    let text = arguments.as_bytes();
    let measured = jsondepth::text_depth(text);
    let (what, depth) = match (&measured.deepest_member, measured.member_name(text)) {
        (Some((_, depth)), Some(argument)) => {
            (format!("argument '{argument}' of tool '{name}'"), *depth)
        }
        // Not an object of keyword arguments (the Python half sends nothing else).
        _ => (format!("the arguments of tool '{name}'"), measured.depth),
    };
    if depth <= MAX_TOOL_JSON_DEPTH {
        return Ok(measured.depth);
    }
    Err(ToolOutcome::error(
        ToolErrorKind::Limit,
        format!(
            "{}; flatten it, or pass it as a JSON string",
            jsondepth::too_deep(&what, depth)
        ),
    ))
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

#[cfg(test)]
mod tests;
