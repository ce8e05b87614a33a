//! Calls that can be cancelled, for `tools.acall`: the event loop's thread checks a call
//! and gets a [`Ticket`] (`prepare`), a thread of the module's pool sends it and waits
//! (`Ticket.wait`), and a task that stops waiting (`asyncio.wait_for`, `asyncio.timeout`,
//! a `TaskGroup` cancelled) cancels the ticket (`Ticket.cancel`):
//!
//! - not sent yet (waiting for a slot): it never is; its thread stops waiting at once;
//! - sent and still waiting for its answer: a `ToolCancel` frame tells the supervisor,
//!   which drops the call and answers it `cancelled`; that answer wakes the thread and
//!   frees the slot (the call's answer, if it crossed the cancel, does the same);
//! - answered, or its job ended: nothing is sent.
//!
//! At most one `ToolCancel` goes out per call. The pool's threads are started here too
//! (`start_thread`), with a small stack of their own.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyString;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome, WorkerMessage};

use super::{Checked, TOOLS, Tools, channel_broke, memory_for_a_call};
use crate::jobsocket::Answer;

/// The stack of each thread of the pool `tools.acall` runs calls on. Such a thread only
/// waits for a slot, writes a frame and reads frames (the checks, and the JSON of the
/// arguments and of the answer in Python, happen on the event loop's thread). Measured
/// (2026-11-26): reading an answer nested as deep as the job socket's codec lets a call
/// be (125 levels) took between 192 and 256 KiB of stack in a debug build; answers are
/// now read as text, without recursion (`jobsocket::answer`), so their depth costs no
/// stack here, and 512 KiB is room to spare. CPython's default, 8 MiB, counts against
/// the job's RLIMIT_DATA like the heap: only ~30 such threads started under the default
/// 256 MB limit. 64 (`tools.max_concurrent_calls` at most) take 32 MiB.
pub const POOL_THREAD_STACK_BYTES: usize = 512 * 1024;

/// What a thread's start maps besides its stack: Rust's signal stack (a few pages),
/// CPython's thread state and its first frame chunk (16 KiB), an arena of glibc's malloc
/// for the thread (132 KiB), with room to spare.
const THREAD_START_BYTES: usize = 256 * 1024;

/// Where a cancellable call stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Progress {
    #[default]
    Unsent,
    /// Sent as call `id` of job `job`.
    Sent { job: u64, id: u64 },
    /// Its program stopped waiting for it.
    Cancelled,
}

/// A call's [`Progress`], shared by the thread making it and the one cancelling it.
/// Locked after the write lock and the tools' state, never before.
#[derive(Debug, Default)]
pub(super) struct Cancellable(Mutex<Progress>);

impl Cancellable {
    pub(super) fn progress(&self) -> MutexGuard<'_, Progress> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn is_cancelled(&self) -> bool {
        *self.progress() == Progress::Cancelled
    }
}

/// What a call gets that its program stopped waiting for before it was sent (nobody reads
/// it: the awaiting task is gone).
pub(super) fn stopped_waiting() -> ToolOutcome {
    ToolOutcome::error(
        ToolErrorKind::Cancelled,
        "the program stopped waiting for this call",
    )
}

impl Tools {
    /// Cancels a call (see the module docs). Takes the write lock: a `ToolCancel` is
    /// written whole, and a call being sent is either sent before or not at all.
    pub(super) fn cancel(&self, cancellable: &Cancellable) {
        let mut writer = self.socket.writer();
        let state = self.state();
        let was = std::mem::replace(&mut *cancellable.progress(), Progress::Cancelled);
        match was {
            Progress::Unsent => {
                drop(state);
                // Set under the state lock, which the wait for a slot checks it under.
                self.slot_freed.notify_all();
            }
            Progress::Sent { job, id } if state.job == job && self.socket.awaits(id) => {
                drop(state);
                // A socket that broke is for the waiting thread to find.
                let _ = writer.send(&WorkerMessage::ToolCancel { id });
            }
            // Answered already, answered locally when its job ended, or cancelled before.
            Progress::Sent { .. } | Progress::Cancelled => {}
        }
    }
}

/// A call checked and ready to be made once (`wait`), from any thread, and cancelled
/// (`cancel`) from another.
#[pyclass(module = "_snakecage_tools", frozen)]
pub struct Ticket {
    tools: &'static Tools,
    call: Mutex<Option<Checked>>,
    cancellable: Cancellable,
}

#[pymethods]
impl Ticket {
    /// Waits for a slot, sends the call and waits for its answer, with the GIL released;
    /// returns the JSON of the outcome, like `call`. A ticket is made once.
    fn wait(&self, py: Python<'_>) -> PyResult<String> {
        memory_for_a_call()?;
        let call = self
            .call
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this call was made already"))?;
        let answer = py
            .detach(|| self.tools.send(call, Some(&self.cancellable)))
            .map_err(channel_broke)?;
        Ok(answer.into_json())
    }

    /// Stops waiting for the call; harmless when it was answered already.
    fn cancel(&self, py: Python<'_>) {
        py.detach(|| self.tools.cancel(&self.cancellable));
    }
}

/// Checks a call of `name` with `arguments` (JSON) for the current job: a [`Ticket`] to
/// make it with, or the JSON of the refusal (an unknown tool, arguments that fail the
/// schema), unsent.
#[pyfunction]
fn prepare(py: Python<'_>, name: &str, arguments: &str) -> PyResult<Py<PyAny>> {
    memory_for_a_call()?;
    match TOOLS.check(name, arguments) {
        Ok(checked) => Ok(Py::new(
            py,
            Ticket {
                tools: &TOOLS,
                call: Mutex::new(Some(checked)),
                cancellable: Cancellable::default(),
            },
        )?
        .into_any()),
        Err(refused) => Ok(PyString::new(py, &Answer::local(&refused).into_json())
            .into_any()
            .unbind()),
    }
}

/// Starts a thread named `name` with a stack of [`POOL_THREAD_STACK_BYTES`] that runs
/// `target(started)`, and returns once it runs: `target` calls `started()` first thing.
/// Not `threading`: its stack size is the process's, read by every thread started
/// meanwhile; this one is this thread's alone. A thread that cannot start (the job's
/// memory limit), that there is no room to start, or that cannot run Python once started,
/// raises `RuntimeError`, and nothing has run.
///
/// A start maps memory outside the allocator (the stack, Rust's signal stack, CPython's
/// thread state and its first frames), and the two in the middle abort the worker when
/// they cannot: so a thread is started only with room for all of it, and the next one not
/// before this one has taken its room (starts measured together would each find the same
/// room free).
#[pyfunction]
fn start_thread(py: Python<'_>, target: Py<PyAny>, name: String) -> PyResult<()> {
    let cannot = |why: &dyn std::fmt::Display| {
        PyRuntimeError::new_err(format!("can't start new thread: {why}"))
    };
    crate::reserve::room_for(POOL_THREAD_STACK_BYTES + THREAD_START_BYTES)
        .map_err(|e| cannot(&e))?;
    let (started, running) = std::sync::mpsc::sync_channel(1);
    let started = Started(Mutex::new(Some(started)));
    std::thread::Builder::new()
        .name(name)
        .stack_size(POOL_THREAD_STACK_BYTES)
        .spawn(move || {
            Python::attach(move |py| {
                let started = match Py::new(py, started) {
                    Ok(started) => started,
                    Err(_) => return, // no memory for it: told by `started` dropped
                };
                if let Err(e) = target.call1(py, (started.clone_ref(py),)) {
                    // One that never ran (no memory for its first frame) was refused to
                    // its caller already.
                    if started.get().was_told() {
                        e.write_unraisable(py, None);
                    }
                }
                drop(target);
            });
        })
        .map_err(|e| cannot(&e))?;
    py.detach(move || running.recv())
        .map_err(|_| cannot(&"the run's memory is used up (its memory limit)"))
}

/// What a thread of the pool calls once it runs; dropped uncalled, its start failed.
#[pyclass(module = "_snakecage_tools", frozen)]
struct Started(Mutex<Option<std::sync::mpsc::SyncSender<()>>>);

impl Started {
    fn sender(&self) -> MutexGuard<'_, Option<std::sync::mpsc::SyncSender<()>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn was_told(&self) -> bool {
        self.sender().is_none()
    }
}

#[pymethods]
impl Started {
    fn __call__(&self) {
        if let Some(started) = self.sender().take() {
            let _ = started.send(());
        }
    }
}

pub(super) fn add_to(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Ticket>()?;
    module.add_class::<Started>()?;
    module.add_function(wrap_pyfunction!(prepare, module)?)?;
    module.add_function(wrap_pyfunction!(start_thread, module)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{sent, sent_call, tools, wait_until, weather};
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    /// A call of `tools` made on its own thread, cancellable through the returned handle.
    fn cancellable_call(
        tools: &'static Tools,
        city: &str,
    ) -> (Arc<Cancellable>, std::thread::JoinHandle<Answer>) {
        let arguments = serde_json::json!({ "city": city }).to_string();
        let cancellable = Arc::new(Cancellable::default());
        let mine = cancellable.clone();
        let thread = std::thread::spawn(move || {
            let checked = tools.check("weather", &arguments).unwrap();
            tools.send(checked, Some(&mine)).unwrap()
        });
        (cancellable, thread)
    }

    fn answer(supervisor: &mut UnixStream, id: u64, outcome: ToolOutcome) {
        let msg = snakecage_worker::protocol::JobRequest::ToolResult(
            snakecage_worker::protocol::ToolResult { id, outcome },
        );
        snakecage_worker::frame::write_frame(supervisor, &msg).unwrap();
    }

    #[test]
    fn a_call_cancelled_while_waiting_for_a_slot_is_never_sent() {
        let (tools, mut supervisor) = tools();
        tools.offer(&[weather()], 1);
        let (_, first) = cancellable_call(tools, "Bern");
        let holding = sent_call(&mut supervisor);
        let (second, waiting) = cancellable_call(tools, "Sion");
        wait_until(|| tools.state().waiting_for_slot == 1);
        tools.cancel(&second);
        assert_eq!(waiting.join().unwrap(), stopped_waiting());
        // Nothing went out for it: the next frame is the next call's.
        answer(
            &mut supervisor,
            holding.id,
            ToolOutcome::Ok { result: 1.into() },
        );
        assert_eq!(first.join().unwrap(), ToolOutcome::Ok { result: 1.into() });
        let (_, third) = cancellable_call(tools, "Chur");
        let next = sent_call(&mut supervisor);
        assert_eq!(next.arguments["city"], "Chur");
        answer(
            &mut supervisor,
            next.id,
            ToolOutcome::Ok { result: 3.into() },
        );
        assert_eq!(third.join().unwrap(), ToolOutcome::Ok { result: 3.into() });
    }

    #[test]
    fn a_sent_call_cancelled_is_cancelled_once_at_the_supervisor_and_frees_its_slot() {
        let (tools, mut supervisor) = tools();
        tools.offer(&[weather()], 1);
        let (cancellable, thread) = cancellable_call(tools, "Genève");
        let call = sent_call(&mut supervisor);
        wait_until(|| tools.socket.awaits(call.id));
        tools.cancel(&cancellable);
        tools.cancel(&cancellable);
        let WorkerMessage::ToolCancel { id } = sent(&mut supervisor) else {
            panic!("no cancel")
        };
        assert_eq!(id, call.id);
        // The thread waits for the supervisor's answer, which frees the slot.
        assert_eq!(tools.state().in_flight, 1);
        let cancelled = ToolOutcome::error(ToolErrorKind::Cancelled, "stopped");
        answer(&mut supervisor, call.id, cancelled.clone());
        assert_eq!(thread.join().unwrap(), cancelled);
        assert_eq!(tools.state().in_flight, 0);
        // The second cancel sent nothing: the next frame is the next call.
        let (_, next) = cancellable_call(tools, "Aarau");
        let again = sent_call(&mut supervisor);
        assert_eq!(again.arguments["city"], "Aarau");
        answer(
            &mut supervisor,
            again.id,
            ToolOutcome::Ok { result: 2.into() },
        );
        assert_eq!(next.join().unwrap(), ToolOutcome::Ok { result: 2.into() });
    }

    #[test]
    fn cancelling_an_answered_call_or_one_whose_job_ended_sends_nothing() {
        let (tools, mut supervisor) = tools();
        tools.offer(&[weather()], 2);
        let (answered, thread) = cancellable_call(tools, "Zug");
        let call = sent_call(&mut supervisor);
        answer(
            &mut supervisor,
            call.id,
            ToolOutcome::Ok { result: 0.into() },
        );
        assert_eq!(thread.join().unwrap(), ToolOutcome::Ok { result: 0.into() });
        tools.cancel(&answered);
        let (ended, thread) = cancellable_call(tools, "Thun");
        let late = sent_call(&mut supervisor);
        tools.withdraw();
        tools.cancel(&ended);
        // The supervisor's own answer after the job's end wakes the thread reading.
        answer(&mut supervisor, late.id, stopped_waiting());
        assert_eq!(thread.join().unwrap(), super::super::run_ended());
        // Nothing went out after the calls: the next frame is the job loop's.
        tools.socket.send(&WorkerMessage::ResetDone).unwrap();
        assert!(matches!(sent(&mut supervisor), WorkerMessage::ResetDone));
    }
}
