//! The fork server: a single-threaded loop over the control socket and SIGCHLD. It forks
//! workers on request (a little later: see [`FORK_DELAY`]), reaps every child and reports
//! each exit status.

use std::collections::HashSet;
use std::convert::Infallible;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use pyo3::prelude::*;
use snakecage_worker::fdpass::{pidfd_open, recv_record, send_record};
use snakecage_worker::frame::{self, MAX_FRAME_LEN};
use snakecage_worker::protocol::{
    ControlReply, ControlRequest, ExitStatus, FORK_FDS, ZygoteConfig, ZygoteInfo,
};

use crate::child;
use crate::hooks;
use crate::hugepages;
use crate::interpreter::{self, InterpreterError, Runner};
use crate::priority;
use crate::sandbox;
use crate::sandbox::layers::Sandbox;
use crate::sandbox::{AtFork, OwnStatus};
use crate::snapshot;

#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error(transparent)]
    Interpreter(#[from] InterpreterError),
    #[error("{doing}: {source}")]
    Io {
        doing: &'static str,
        source: io::Error,
    },
    #[error("the supervisor sent a bad control message: {0}")]
    Protocol(String),
}

fn io_err(doing: &'static str) -> impl FnOnce(io::Error) -> ZygoteError {
    move |source| ZygoteError::Io { doing, source }
}

/// Largest control record the zygote accepts (requests are tiny).
const MAX_CONTROL_RECORD: usize = 64 << 10;

/// How long a fork request may wait for a child's exit before it is served anyway.
///
/// The supervisor asks for a replacement as soon as it takes a worker, that is just before
/// it sends that worker its job. Forking an interpreter this size holds a CPU in the kernel
/// for a millisecond or more where nothing preempts it (`SCHED_IDLE` or not), and the
/// job's worker may be woken onto that CPU: so a request waits until a child exits (the
/// job's worker, usually: the CPU it held is free again) or this long has passed, whichever
/// comes first. Waiting here, and not in the supervisor, costs no wake-up of its own: the
/// zygote is woken by that exit anyway, and reports it with the fork reply.
const FORK_DELAY: Duration = Duration::from_millis(2);

/// A fork the supervisor asked for, not made yet.
struct PendingFork {
    worker_id: u64,
    warm_up: bool,
    uid: Option<u32>,
    workspace: Option<String>,
    fds: Vec<OwnedFd>,
    /// When it is made even if no child has exited by then.
    due: Instant,
}

/// Forks this interpreter the way `os.fork()` does (`PyOS_BeforeFork`, `fork`,
/// `PyOS_AfterFork_Child` or `_Parent`), once the process is known to have one thread
/// (read through `own`, this process's status). In the child, runs `child` with what the
/// status told of the parent, and never returns (`Infallible`); in the parent, returns the
/// child's pid. What `child` captures (the parent's copies of the child's fds, say) is
/// dropped in the parent once the fork is made.
pub(crate) fn fork_interpreter(
    own: &OwnStatus,
    child: impl FnOnce(AtFork) -> Infallible,
) -> io::Result<i32> {
    let at_fork = own
        .before_fork()
        .map_err(|e| io::Error::other(format!("refusing to fork: {e}")))?;
    // SAFETY: PyOS_BeforeFork/AfterFork_* bracket fork() exactly as os.fork() does; the
    // process is single-threaded (checked above), so this thread is the one holding the
    // GIL. The child never returns from this block: `child` diverges. errno is read
    // before PyOS_AfterFork_Parent can change it.
    let forked = unsafe {
        pyo3::ffi::PyOS_BeforeFork();
        let pid = libc::fork();
        let forked = if pid < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(pid)
        };
        if pid == 0 {
            pyo3::ffi::PyOS_AfterFork_Child();
            child(at_fork);
        }
        pyo3::ffi::PyOS_AfterFork_Parent();
        forked
    };
    forked.map_err(|e| io::Error::other(format!("fork failed: {e}")))
}

pub fn run(control: OwnedFd, config: ZygoteConfig) -> Result<(), ZygoteError> {
    // The zygote dies with the supervisor; its workers die with it in turn.
    let supervisor = config.supervisor_pid.map(nix::unistd::Pid::from_raw);
    sandbox::die_with_parent(supervisor).map_err(io_err("setting PR_SET_PDEATHSIG"))?;
    sandbox::stdin_from_dev_null().map_err(io_err("opening /dev/null"))?;
    sandbox::fixed_environment(&config);
    priority::set_startup_nice(config.startup_nice);
    // Namespaces, the seccomp policy and the probe of every worker layer: before CPython
    // starts, while this process has one thread and the interpreter has opened nothing.
    let mut sandbox = Sandbox::setup(&config, &interpreter::python_home(&config));
    let own_status = OwnStatus::open().map_err(io_err("opening /proc/self/status"))?;
    interpreter::initialize(&config)?;

    // SIGCHLD is read from a signalfd, so it must stay blocked; children unblock it.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block()
        .map_err(|e| io_err("blocking SIGCHLD")(e.into()))?;
    let sigchld = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| io_err("creating the SIGCHLD signalfd")(e.into()))?;

    Python::attach(|py| {
        // The audit hook and import guard go in before anything is imported, inert until
        // a worker arms them.
        sandbox.reports.extend(hooks::install(py, &config.sandbox));
        let interpreter::Prepared {
            runner,
            preloaded,
            preload_failures,
            packages,
        } = interpreter::prepare(py, &config)?;
        own_status
            .one_thread()
            .map_err(io_err("checking threads after preload"))?;
        // The bulk of the seccomp policy, once: every worker forked from here inherits it.
        sandbox.seal_zygote();
        if config.snapshot {
            // The heap, complete and frozen now, mapped back from memfds: fork copies no
            // page table for it and exit unmaps only what a worker touched. From here on
            // the zygote runs no Python of its own, only the fork loop below (Rust, the
            // interpreter's at-fork bookkeeping and the preloads' at-fork hooks); what it
            // writes becomes anonymous again.
            own_status
                .one_thread()
                .map_err(io_err("checking threads before the snapshot"))?;
            // SAFETY: this process has exactly one thread (checked just above), so nothing
            // writes to a mapping between its copy and its replacement.
            match unsafe { snapshot::snapshot_anonymous() } {
                Ok(_) => {}
                // A mapping failed half way is still intact (each one is replaced whole or
                // not at all); the zygote runs on, with that part of the heap anonymous.
                Err(e) => eprintln!("snakecage-worker: the heap snapshot stopped: {e}"),
            }
        } else {
            // Fork and exit cost per page-table entry: the heap, complete now, in 2 MiB
            // pages. Mappings the kernel will not collapse (reserved, unaligned) are
            // normal; only a heap with no huge page at all is worth a line in the log.
            match hugepages::collapse_anonymous() {
                Ok(c) if c.huge_pages > 0 || c.failed == 0 => {}
                Ok(c) => eprintln!(
                    "snakecage-worker: no part of the heap could be mapped in huge pages ({} MiB refused)",
                    c.failed * 2
                ),
                Err(e) => eprintln!("snakecage-worker: reading /proc/self/maps: {e}"),
            }
        }
        // Forks and everything a child does before Ready is background work: on a small
        // machine it must not take the CPU from a request in flight. The supervisor raises
        // a worker back when it gives it a job.
        priority::lower_to_background();
        let info = ZygoteInfo {
            pid: std::process::id() as i32,
            python_version: interpreter::python_version(),
            preloaded,
            preload_failures,
            sandbox: sandbox.reports.clone(),
            packages,
        };
        let mut zygote = Zygote {
            runner,
            control,
            sigchld,
            own_status,
            children: HashSet::new(),
            pending: Vec::new(),
            exited: Vec::new(),
            config: &config,
            sandbox: &sandbox,
        };
        zygote.reply(&ControlReply::Hello(info), None)?;
        zygote.serve()
    })
}

struct Zygote<'py, 'c> {
    runner: Runner<'py>,
    control: OwnedFd,
    sigchld: SignalFd,
    own_status: OwnStatus,
    children: HashSet<i32>,
    /// Forks asked for and not made yet, oldest first.
    pending: Vec<PendingFork>,
    /// Children reaped and not reported yet.
    exited: Vec<(i32, ExitStatus)>,
    config: &'c ZygoteConfig,
    sandbox: &'c Sandbox,
}

impl Zygote<'_, '_> {
    fn serve(&mut self) -> Result<(), ZygoteError> {
        let mut buf = vec![0u8; MAX_CONTROL_RECORD];
        loop {
            let timeout = match self.pending.first() {
                None => PollTimeout::NONE,
                Some(first) => {
                    let wait = first.due.saturating_duration_since(Instant::now());
                    // Rounded up: woken a little early, the fork would wait another round.
                    let ms = wait.as_micros().div_ceil(1000);
                    PollTimeout::from(ms.min(60_000) as u16)
                }
            };
            let (control_ready, child_exited) = {
                let mut fds = [
                    PollFd::new(self.control.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.sigchld.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, timeout) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(io_err("polling")(e.into())),
                }
                let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]))
            };
            if control_ready {
                let rec = recv_record(self.control.as_fd(), &mut buf)
                    .map_err(io_err("reading the control socket"))?;
                if rec.bytes == 0 && rec.fds.is_empty() {
                    return self.shutdown(); // the supervisor is gone
                }
                let request: ControlRequest = frame::decode_exact(&buf[..rec.bytes], MAX_FRAME_LEN)
                    .map_err(|e| ZygoteError::Protocol(e.to_string()))?;
                match request {
                    ControlRequest::Fork {
                        worker_id,
                        warm_up,
                        uid,
                        workspace,
                    } => self.pending.push(PendingFork {
                        worker_id,
                        warm_up,
                        uid,
                        workspace,
                        fds: rec.fds,
                        due: Instant::now() + FORK_DELAY,
                    }),
                    ControlRequest::Shutdown => return self.shutdown(),
                }
            }
            if child_exited {
                while let Ok(Some(_)) = self.sigchld.read_signal() {}
                self.reap()?;
            }
            // A child's exit frees the CPU it held: every waiting fork is made now (also
            // those asked for later, which would otherwise cost a wake-up of their own).
            let due = self
                .pending
                .first()
                .is_some_and(|first| child_exited || first.due <= Instant::now());
            if due {
                for PendingFork {
                    worker_id,
                    warm_up,
                    uid,
                    workspace,
                    fds,
                    ..
                } in std::mem::take(&mut self.pending)
                {
                    self.fork(worker_id, warm_up, uid, workspace, fds)?;
                }
            }
            // Exits are reported after the forks of the same round, in one burst with their
            // replies: the supervisor reads them all in one wake-up.
            for (pid, status) in std::mem::take(&mut self.exited) {
                self.reply(&ControlReply::Exited { pid, status }, None)?;
            }
        }
    }

    fn reply(&self, msg: &ControlReply, fd: Option<BorrowedFd<'_>>) -> Result<(), ZygoteError> {
        let bytes = frame::encode(msg).map_err(|e| ZygoteError::Protocol(e.to_string()))?;
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        send_record(self.control.as_fd(), &bytes, &fds)
            .map_err(io_err("replying to the supervisor"))
    }

    fn fork(
        &mut self,
        worker_id: u64,
        warm_up: bool,
        uid: Option<u32>,
        workspace: Option<String>,
        fds: Vec<OwnedFd>,
    ) -> Result<(), ZygoteError> {
        let fds: [OwnedFd; FORK_FDS] = match fds.try_into() {
            Ok(fds) => fds,
            Err(fds) => {
                let reason = format!(
                    "fork request carried {} fds, expected {FORK_FDS}",
                    fds.len()
                );
                return self.reply(&ControlReply::ForkFailed { worker_id, reason }, None);
            }
        };
        let zygote_pid = nix::unistd::getpid();
        let (runner, limits, sandbox) = (&self.runner, &self.config.limits, self.sandbox);
        let uid = uid.unwrap_or(self.config.sandbox.uid);
        let forked = fork_interpreter(&self.own_status, move |at_fork| {
            let birth = child::Birth {
                zygote: zygote_pid,
                uid,
                warm_up,
                workspace,
                at_fork,
            };
            child::run(runner, fds, limits, sandbox, birth)
        });
        let pid = match forked {
            Ok(pid) => pid,
            Err(e) => {
                let reason = e.to_string();
                return self.reply(&ControlReply::ForkFailed { worker_id, reason }, None);
            }
        };
        self.children.insert(pid);
        // Not reaped yet: only this thread reaps, and it is here.
        let pidfd = pidfd_open(pid);
        self.reply(
            &ControlReply::Forked { worker_id, pid },
            pidfd.as_ref().map(|fd| fd.as_fd()),
        )
    }

    /// Reaps every child that has exited, to be reported after this round's forks.
    fn reap(&mut self) -> Result<(), ZygoteError> {
        loop {
            let status = match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, ExitStatus::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, ExitStatus::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => return Ok(()),
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io_err("reaping children")(e.into())),
            };
            let (pid, status) = (status.0.as_raw(), status.1);
            self.children.remove(&pid);
            self.exited.push((pid, status));
        }
    }

    /// Kills every child and waits for each: no orphans, no zombies.
    fn shutdown(&mut self) -> Result<(), ZygoteError> {
        for &pid in &self.children {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        for pid in self.children.drain() {
            let _ = waitpid(Pid::from_raw(pid), None);
        }
        Ok(())
    }
}
