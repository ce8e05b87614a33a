//! One worker's life after fork: harden, in order, warm up, say Ready, run one job (or,
//! told to be a session, serve jobs on one namespace until the supervisor hangs up), exit.
//!
//! The order matters and each step says why it comes where it does. Nothing here returns:
//! the worker ends with `_exit`, skipping CPython finalisation and atexit handlers (they
//! belong to the zygote).

use std::fs::File;
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
use nix::unistd::Pid;
use snakecage_worker::frame::{self, FrameError};
use snakecage_worker::protocol::{
    EXIT_HARDENING_FAILED, EXIT_PROTOCOL, JobRequest, JobResult, WorkerLimits, WorkerMessage,
};

use crate::hooks;
use crate::interpreter::{InterpreterError, Runner, result_frame};
use crate::jobsocket::JOB;
use crate::priority;
use crate::sandbox::layers::Sandbox;
use crate::sandbox::{self, AtFork, fds, rlimits};

#[derive(Debug, thiserror::Error)]
enum ChildError {
    #[error("{step}: {source}")]
    Step {
        step: &'static str,
        source: io::Error,
    },
    #[error(transparent)]
    Python(#[from] InterpreterError),
    #[error("job socket: {0}")]
    Frame(#[from] FrameError),
    #[error("the supervisor sent {0} out of place")]
    Protocol(&'static str),
    #[error("job socket: {0}")]
    Socket(String),
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> ChildError {
    move |source| ChildError::Step { step, source }
}

fn step_named(step: &'static str, source: io::Error) -> ChildError {
    ChildError::Step { step, source }
}

/// What the zygote tells a worker at its fork, beside its descriptors.
pub struct Birth {
    pub zygote: Pid,
    /// The worker's own unprivileged uid.
    pub uid: u32,
    /// Whether to run the tier's warm-up (no job was waiting when the fork was asked for).
    pub warm_up: bool,
    /// The workspace's path, as the supervisor made it (`ControlRequest::Fork`).
    pub workspace: Option<String>,
    pub at_fork: AtFork,
}

pub fn run(
    runner: &Runner<'_>,
    fds: [OwnedFd; 4],
    limits: &WorkerLimits,
    sandbox: &Sandbox,
    birth: Birth,
) -> ! {
    let warmed = match harden(runner, fds, limits, sandbox, birth) {
        Ok(warmed) => warmed,
        Err(e) => {
            report(&e);
            exit(EXIT_HARDENING_FAILED);
        }
    };
    let rlimits = sandbox.applies_rlimits().then_some(limits);
    match serve(runner, warmed, rlimits) {
        Ok(()) => exit(0),
        Err(e) => {
            report(&e);
            exit(EXIT_PROTOCOL)
        }
    }
}

fn harden(
    runner: &Runner<'_>,
    fds: [OwnedFd; 4],
    limits: &WorkerLimits,
    sandbox: &Sandbox,
    birth: Birth,
) -> Result<bool, ChildError> {
    let Birth {
        zygote,
        uid,
        warm_up,
        workspace,
        at_fork,
    } = birth;
    // 1. Die with the zygote, then check it is still there: PDEATHSIG set after the parent
    //    died would never fire.
    sandbox::die_with_parent(Some(zygote)).map_err(step("PR_SET_PDEATHSIG"))?;
    // The zygote blocks SIGCHLD for its signalfd; the worker wants default signals back.
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(|e| step("unblocking signals")(e.into()))?;
    // Rust's runtime catches SIGSEGV/SIGBUS to report stack overflows; a worker must crash
    // on them like plain CPython does, so a sent SIGSEGV kills it too.
    for sig in [Signal::SIGSEGV, Signal::SIGBUS] {
        // SAFETY: restoring the default disposition installs no handler code.
        unsafe { signal(sig, SigHandler::SigDfl) }
            .map_err(|e| step("resetting crash signals")(e.into()))?;
    }
    // 2. Exactly our own fds: stdout/stderr onto the pipes (so C-level writes are captured
    //    too), then everything inherited from the zygote closed, but the descriptors it
    //    opened once for its workers' hardening (Landlock's rule paths, the cgroup's
    //    files), which go once the layers are on.
    fds::arrange(fds, sandbox.inherited_fds()).map_err(step("arranging fds"))?;
    fds::enter_workspace(workspace.as_deref()).map_err(step("entering the workspace"))?;
    //    Into the instance's cgroup before anything of the job can start a thread, and while
    //    this process may still write the cgroup's files (before the uid drop and Landlock).
    sandbox
        .join_cgroup()
        .map_err(step("joining the instance's cgroup"))?;
    //    First in line for the kernel's out-of-memory killer, wherever memory runs out (the
    //    instance's bound, a container's, the host's): a worker, never its zygote or the
    //    supervisor, nor the host's other processes while a worker is left. Raising one's
    //    own score needs no privilege; a kernel without the file leaves it as it was.
    let _ = sandbox::oom_first();
    // 3. Resource limits, before any user-controlled allocation; the allocator's
    //    emergency reserve just before them, so the job's memory budget does not pay for
    //    it. A kernel that refuses it leaves the worker without one, as it was before.
    //    The budget goes on top of the data size this worker has: the zygote's at the
    //    fork (read there, through a descriptor it keeps) and the reserve's mapping. What
    //    this worker's own steps above allocated counts against the budget: a few small
    //    blocks, from the heap's free room.
    let reserve = crate::reserve::arm().map_or(0, |()| crate::reserve::RESERVE_BYTES as u64);
    if sandbox.applies_rlimits() {
        rlimits::apply(limits, at_fork.data_bytes.saturating_add(reserve))
            .map_err(step("setting rlimits"))?;
    }
    // 4.–6. Drop to this worker's own unprivileged uid (PDEATHSIG re-armed: the credential change clears
    //    it), no_new_privs, Landlock (read-only Python, read-write workspace, scoped signals
    //    and abstract sockets), seccomp last: it would deny the calls of the steps before.
    //    Only the layers the zygote's start-up probe proved are applied; each one that
    //    fails here keeps this worker from ever becoming Ready.
    // SAFETY: fd 4 is the workspace directory placed by `arrange`; it stays open for the
    // life of the process.
    let workspace = unsafe { BorrowedFd::borrow_raw(fds::WORKSPACE_FD) };
    sandbox
        .harden_worker(workspace, zygote, uid)
        .map_err(|(layer, e)| step_named(layer, e))?;
    // 7. Python level: pay this child's copy-on-write faults and first-use costs with
    //    the tier's throwaway warm-up jobs, so the real job does not (unless a job is
    //    already waiting for this worker: it would wait for the warm-up, then pay its own
    //    run on top); then fresh RNG state, after the warm-up so nothing it did can show
    //    in the job's numbers. The audit hook and import guard are armed last, so neither
    //    the warm-up nor the runner's set-up trips them. Whether a job waits is decided
    //    twice: when the fork is asked for (`warm_up`), and here, as late as possible.
    //    A tier without warm-up jobs has nothing to pay: its workers count as warmed.
    let warmed = if !runner.has_warm_up() {
        true
    } else if warm_up && !skip_warm_up_asked()? {
        runner.warm_up_child()?;
        true
    } else {
        false
    };
    runner.prepare_child()?;
    hooks::arm().map_err(step("arming the Python hooks"))?;
    Ok(warmed)
}

/// Whether the supervisor has asked this worker to skip its warm-up
/// ([`JobRequest::SkipWarmUp`]): a look at the job socket that does not wait. Before
/// `Ready` the supervisor sends nothing else; a closed socket is left for `serve` to find.
fn skip_warm_up_asked() -> Result<bool, ChildError> {
    use nix::errno::Errno;
    use nix::sys::socket::{MsgFlags, recv};

    let mut first = [0u8; 1];
    let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    match recv(fds::JOB_FD, &mut first, flags) {
        Ok(0) | Err(Errno::EAGAIN) => Ok(false),
        Ok(_) => {
            // SAFETY: fd 3 is the job socket placed by `fds::arrange`; ManuallyDrop keeps
            // this File from closing it. The request is written whole, so this read of a
            // few bytes does not wait for more.
            let mut sock = ManuallyDrop::new(unsafe { File::from_raw_fd(fds::JOB_FD) });
            match frame::read_frame::<_, JobRequest>(&mut *sock, MAX_EARLY_FRAME_LEN)? {
                Some(JobRequest::SkipWarmUp) => Ok(true),
                Some(_) => Err(ChildError::Protocol("a request before Ready")),
                None => Ok(false),
            }
        }
        Err(e) => Err(step_named("looking at the job socket", e.into())),
    }
}

/// The largest frame read before `Ready`: the only one expected is a `SkipWarmUp`.
const MAX_EARLY_FRAME_LEN: usize = 64;

/// `rlimits`: the limits this worker set itself, when the `rlimits` layer applies.
fn serve(
    runner: &Runner<'_>,
    warmed: bool,
    rlimits: Option<&WorkerLimits>,
) -> Result<(), ChildError> {
    // Every frame goes through the job socket's demultiplexer (`jobsocket`): tool calls of
    // the job's threads share it with this loop.
    JOB.send(&WorkerMessage::Ready { warmed })?;
    let mut request = JOB.next_request().map_err(ChildError::Socket)?;
    if let Some(JobRequest::SkipWarmUp) = request {
        // Asked for after the warm-up had begun: it goes before any job.
        request = JOB.next_request().map_err(ChildError::Socket)?;
    }
    let Some(request) = request else {
        return Ok(()); // the supervisor let this worker go without a job
    };
    match request {
        JobRequest::Run(job) => {
            // One job: its CPU time, not a session's life's, before any of its code runs.
            if let Some(limits) = rlimits {
                rlimits::for_one_job(limits).map_err(step("limiting CPU time to one job's"))?;
            }
            send_result(runner.run(&job)?)?;
        }
        JobRequest::StartSession => serve_session(runner)?,
        JobRequest::Reset | JobRequest::Inspect => {
            return Err(ChildError::Protocol(
                "a session request to a stateless worker",
            ));
        }
        // Tool answers are filed by the demultiplexer, never handed to the job loop.
        JobRequest::ToolResult(_) => {
            return Err(ChildError::Protocol("a tool result before a job"));
        }
        JobRequest::SkipWarmUp => return Err(ChildError::Protocol("a second SkipWarmUp")),
    }
    Ok(())
}

/// A session: one namespace, one request at a time, until the socket closes.
///
/// The supervisor interrupts an overdue job with SIGINT, which CPython's handler turns
/// into `KeyboardInterrupt` at the next bytecode. It can land in user code (the job ends
/// with it, the state is kept), in the runner (reported the same way, see
/// `Session::run`), or between jobs, after the result went out: then it waits as a
/// pending signal, and is discarded before the next request is served.
///
/// A thread an earlier job left running may be blocked on a tool call, reading the job
/// socket: the next request reaches this loop through the same demultiplexer, whichever
/// thread reads it, and the supervisor's answers to calls of ended jobs are discarded.
///
/// The wait for the next request releases the GIL, so the threads a job left running go
/// on between jobs, as a notebook's do between cells (what they print comes with the next
/// job's output). asyncio tasks go on only while a job awaits: the session's loop runs then.
fn serve_session(runner: &Runner<'_>) -> Result<(), ChildError> {
    let session = runner.new_session()?;
    let py = runner.py();
    while let Some(request) = py
        .detach(|| JOB.next_request())
        .map_err(ChildError::Socket)?
    {
        runner.discard_pending_interrupt();
        let reply = match request {
            JobRequest::Run(job) => {
                send_result(session.run(runner, &job)?)?;
                continue;
            }
            JobRequest::Reset => {
                session.reset()?;
                WorkerMessage::ResetDone
            }
            JobRequest::Inspect => {
                let (variables, total) = session.variables();
                WorkerMessage::Variables { variables, total }
            }
            JobRequest::StartSession => return Err(ChildError::Protocol("a second StartSession")),
            JobRequest::ToolResult(_) => {
                return Err(ChildError::Protocol("a tool result between jobs"));
            }
            JobRequest::SkipWarmUp => {
                return Err(ChildError::Protocol("a SkipWarmUp after Ready"));
            }
        };
        JOB.send(&reply)?;
    }
    Ok(())
}

/// Sends a job's result ([`result_frame`]: its rich outputs dropped for a note when there
/// is no room for them).
fn send_result(result: JobResult) -> Result<(), ChildError> {
    JOB.writer().send_encoded(&result_frame(result)?)?;
    Ok(())
}

/// Best effort: the supervisor logs what a worker wrote to stderr before it died.
fn report(e: &ChildError) {
    let _ = writeln!(io::stderr(), "snakecage-worker: {e}");
}

fn exit(code: i32) -> ! {
    // Tearing down an address space the size of the zygote's costs milliseconds of CPU:
    // background work, like the fork was. Lowering oneself needs no privilege.
    let _ = priority::set_idle();
    // SAFETY: _exit ends the process immediately; skipping destructors and CPython
    // finalisation is the point (they belong to the zygote's state).
    unsafe { libc::_exit(code) }
}
