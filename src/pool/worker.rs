//! One forked worker as the supervisor holds it: its job socket, its output pipes, its
//! workspace and a pidfd. Dropping a `Worker` SIGKILLs it: a worker is never reused and
//! never outlives its handle (no orphans; the zygote reaps it).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::sys::socket::MsgFlags;
use snakecage_worker::frame::{self, FrameDecoder, FrameError, MAX_FRAME_LEN};
use snakecage_worker::protocol::{ExitStatus, JobRequest, WorkerMessage};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::fd::async_fd;
pub(super) use super::fd::read_nonblocking;
use super::starved::{SchedStat, while_starved};
use super::uids::UidLease;
use super::zygote::Forked;

/// A forked, hardened worker, warmed up unless it skipped the warm-up.
pub struct Worker {
    pub id: u64,
    pub pid: i32,
    /// Its zygote's pid (which reaps it and reports its exit).
    zygote_pid: i32,
    /// Its zygote's [`ZygoteHandle::restarts`](super::zygote::ZygoteHandle::restarts): a
    /// worker of a zygote since restarted died with it.
    pub zygote_restarts: u64,
    /// Its pool generation; held, it keeps that generation's zygotes running.
    pub lease: super::GenerationLease,
    pidfd: Option<OwnedFd>,
    pub(super) channel: JobChannel,
    pub(super) stdout: AsyncFd<OwnedFd>,
    pub(super) stderr: AsyncFd<OwnedFd>,
    exit: oneshot::Receiver<ExitStatus>,
    exit_status: Option<ExitStatus>,
    /// Taken out (with [`Worker::take_workspace`]) when it must outlive the worker.
    workspace: Option<Workspace>,
    /// Whether it ran its tier's warm-up (its `Ready` says; until then, false).
    pub(super) warmed: bool,
    /// SIGKILLed already: dropping it has nothing left to do.
    killed: bool,
    /// Whether its zygote was told to shut down (see [`Worker::zygote_end`]).
    zygote_shut_down: Arc<AtomicBool>,
    /// The instance cgroup's count of workers killed for memory, and that count when
    /// this one was forked (see [`Worker::killed_for_memory`]).
    oom: Option<(super::cgroup::OomWatch, u64)>,
}

/// Why a worker's zygote ended, when the worker died with it. Every worker dies with its
/// zygote by design (`PR_SET_PDEATHSIG`, set first thing after the fork): only the zygote
/// can reap it, and no sandboxed process may outlive the processes that watch over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZygoteEnd {
    /// It died (killed from outside, a crash): its tier's zygote is restarted.
    Died,
    /// The service shut it down, stopping: the grace period for in-flight requests
    /// (`worker.shutdown_grace_ms`) had run out.
    ShutDown,
}

impl Worker {
    #[allow(clippy::too_many_arguments)] // each is one part of a forked worker
    pub(super) fn new(
        id: u64,
        zygote_restarts: u64,
        lease: super::GenerationLease,
        forked: Forked,
        channel: JobChannel,
        stdout: OwnedFd,
        stderr: OwnedFd,
        workspace: Workspace,
    ) -> io::Result<Self> {
        Ok(Self {
            id,
            pid: forked.pid,
            zygote_pid: forked.zygote_pid,
            zygote_restarts,
            lease,
            pidfd: forked.pidfd,
            channel,
            stdout: async_fd(stdout)?,
            stderr: async_fd(stderr)?,
            exit: forked.exit,
            exit_status: None,
            workspace: Some(workspace),
            warmed: false,
            killed: false,
            zygote_shut_down: forked.zygote_shut_down,
            oom: None,
        })
    }

    /// Watches the instance cgroup's count of workers killed for memory from now on.
    pub(super) fn watch_oom(&mut self, watch: Option<super::cgroup::OomWatch>) {
        self.oom = watch.and_then(|w| w.kills().map(|now| (w, now)));
    }

    /// Why it died by a SIGKILL the service did not send, when the kernel's out-of-memory
    /// killer most likely sent it: the instance's cgroup counted workers killed for
    /// memory since this one was forked. `None` otherwise, or where nothing bounds the
    /// workers' memory together.
    pub fn killed_for_memory(&self) -> Option<String> {
        let (watch, before) = self.oom.as_ref()?;
        watch.explain(*before)
    }

    /// False once the zygote has reaped it, or the zygote itself is gone. An exit status
    /// that has arrived is kept, so [`Worker::exit_status`] still reports it afterwards.
    pub fn is_alive(&mut self) -> bool {
        if self.exit_status.is_some() {
            return false;
        }
        match self.exit.try_recv() {
            Ok(status) => {
                self.exit_status = Some(status);
                false
            }
            Err(oneshot::error::TryRecvError::Empty) => true,
            Err(oneshot::error::TryRecvError::Closed) => false,
        }
    }

    /// Whether its zygote died before reporting its exit: the kernel killed it with its
    /// zygote (`PR_SET_PDEATHSIG`). Known once its exit has been awaited
    /// ([`Worker::exit_status`]) or its zygote's death read by the supervisor.
    pub fn died_with_its_zygote(&mut self) -> bool {
        !self.is_alive() && self.exit_status.is_none()
    }

    /// Why it died without an exit status of its own, when its zygote's end explains it
    /// (asked once it is dead): the zygote was told to shut down (it kills its workers
    /// and reports none of their exits, however long it takes to exit), or it died (the
    /// kernel killed the worker with it: [`Worker::died_with_its_zygote`]).
    pub fn zygote_end(&mut self) -> Option<ZygoteEnd> {
        if self.exit_status.is_some() {
            return None;
        }
        if self.zygote_shut_down.load(Ordering::Acquire) {
            return Some(ZygoteEnd::ShutDown);
        }
        self.died_with_its_zygote().then_some(ZygoteEnd::Died)
    }

    /// SIGKILL, through the pidfd so a recycled pid can never be hit.
    pub fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.killed = true;
    }

    /// Gives the worker normal CPU priority for its job: `SCHED_OTHER`, nice 0. Workers
    /// start at the zygote's background priority (`SCHED_IDLE`, or nice 10 without
    /// CAP_SYS_NICE), so refilling never competes with a request in flight. Raising needs
    /// CAP_SYS_NICE (a worker cannot raise itself after its uid drop); without it the
    /// worker stays where it was.
    pub fn foreground(&mut self) {
        self.set_priority(libc::SCHED_OTHER, 0);
    }

    /// Back to `SCHED_IDLE` once its job is done and before it is killed, so its exit
    /// (tearing down an address space the size of the zygote's) yields to every request.
    pub fn background(&mut self) {
        self.set_priority(libc::SCHED_IDLE, 19);
    }

    fn set_priority(&mut self, policy: libc::c_int, nice: i32) {
        if !self.is_alive() {
            return; // reaped: its pid may belong to someone else now
        }
        set_priority(self.pid, policy, nice);
    }

    /// SIGINT: CPython raises `KeyboardInterrupt` in the worker's main thread (sessions).
    pub fn interrupt(&self) {
        self.signal(nix::sys::signal::Signal::SIGINT);
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        match &self.pidfd {
            Some(fd) => {
                let _ = pidfd_signal(fd.as_fd(), sig);
            }
            None => {
                // No pidfd (old kernel): only signal a pid whose exit has not been reported.
                if self.exit_status.is_none() && !self.exit.is_terminated() {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig);
                }
            }
        }
    }

    /// A pidfd of its own to signal it by, for a watch that may outlive no handle of it
    /// (`None` without one: a kernel before 5.3, or no fd left).
    pub(super) fn pidfd(&self) -> Option<OwnedFd> {
        self.pidfd.as_ref().and_then(|fd| fd.try_clone().ok())
    }

    /// The exit status, waiting for the zygote to report it: up to `wait`, and longer
    /// while the worker (dying) or its zygote is runnable but held back from a CPU by a
    /// busy host ([`super::starved::while_starved`]). `None`: the zygote died (and took the
    /// worker with it) or did not answer in time.
    pub async fn exit_status(&mut self, wait: std::time::Duration) -> Option<ExitStatus> {
        // A zygote told to shut down reports no more exits: only one already routed here counts.
        let wait = if self.zygote_shut_down.load(Ordering::Acquire) {
            std::time::Duration::ZERO
        } else {
            wait
        };
        let (pid, zygote) = (self.pid, self.zygote_pid);
        let sample = || [SchedStat::of(pid), SchedStat::of(zygote)];
        if self.exit_status.is_none()
            && !self.exit.is_terminated()
            && let Some(Ok(status)) = while_starved(&mut self.exit, wait, sample).await
        {
            self.exit_status = Some(status);
        }
        self.exit_status
    }

    pub fn workspace_path(&self) -> &Path {
        self.workspace.as_ref().map_or(Path::new(""), |w| &w.path)
    }

    /// The workspace, to be scanned after the worker is dead; removed when it is dropped.
    pub(super) fn take_workspace(&mut self) -> Option<Workspace> {
        self.workspace.take()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A worker that ran a job was lowered (if it reported) and killed as the job
        // ended; only one let go otherwise (retired, lost on the way) is done here.
        if !self.killed {
            self.background();
            self.kill();
        }
    }
}

/// The framed job socket, supervisor side. `recv` is cancel-safe (bytes are kept in the
/// decoder), so it can sit in a `select!` next to the output pipes and the deadline.
/// Registered for readability only (see [`super::fd::async_fd`]): the worker reading a job
/// does not wake the supervisor.
pub struct JobChannel {
    sock: AsyncFd<OwnedFd>,
    decoder: FrameDecoder,
}

impl JobChannel {
    /// `sock`: our end of the job socket pair, non-blocking.
    pub fn new(sock: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            sock: async_fd(sock)?,
            decoder: FrameDecoder::new(MAX_FRAME_LEN),
        })
    }

    pub async fn send(&mut self, request: &JobRequest) -> Result<(), FrameError> {
        let bytes = frame::encode(request)?;
        let sock = self.sock.get_ref().as_fd();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            match nix::sys::socket::send(sock.as_raw_fd(), rest, MsgFlags::MSG_NOSIGNAL) {
                Ok(n) => rest = &rest[n..],
                Err(Errno::EAGAIN) => super::fd::writable(sock).await?,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        Ok(())
    }

    /// The next message; `Ok(None)` when the worker closed the socket (it died or exited).
    pub async fn recv(&mut self) -> Result<Option<WorkerMessage>, FrameError> {
        let mut buf = [0u8; 8192];
        loop {
            if let Some(msg) = self.decoder.next_frame()? {
                return Ok(Some(msg));
            }
            let n = loop {
                let mut guard = self.sock.readable().await?;
                match guard.try_io(|sock| read_nonblocking(sock, &mut buf)) {
                    Ok(Ok(n)) => break n,
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => return Err(e.into()),
                    Err(_would_block) => {}
                }
            };
            if n == 0 {
                self.decoder.finish()?;
                return Ok(None);
            }
            self.decoder.push(&buf[..n]);
        }
    }
}

/// A worker's private directory, removed when dropped.
pub struct Workspace {
    pub path: PathBuf,
    /// The worker's uid, which owns what is in here: not handed to another worker before
    /// the directory is removed.
    uid: Option<Arc<UidLease>>,
}

impl Workspace {
    /// Creates the directory (mode 0700), owned by `owner` (the worker's uid, and gid)
    /// when the worker will drop to it, so the worker can write there and no other uid can
    /// look in.
    pub fn create(
        root: &Path,
        worker_id: u64,
        owner: Option<(Arc<UidLease>, u32)>,
    ) -> io::Result<(Self, OwnedFd)> {
        use std::os::unix::fs::DirBuilderExt;
        let path = root.join(format!("w{worker_id}"));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let (uid, gid) = owner.unzip();
        let workspace = Self { path, uid };
        if let (Some(lease), Some(gid)) = (&workspace.uid, gid) {
            std::os::unix::fs::chown(&workspace.path, Some(lease.uid()), Some(gid))?;
        }
        let dir = std::fs::File::open(&workspace.path)?;
        Ok((workspace, OwnedFd::from(dir)))
    }

    /// Removes it now and returns once it is gone: what the job wrote no longer takes
    /// space in the instance's bound when the caller answers its client. (Dropped
    /// instead, it is removed in the background.)
    pub async fn remove(mut self) {
        if let Some(remove) = self.removal() {
            let _ = tokio::task::spawn_blocking(remove).await;
        }
    }

    /// `None` when it is gone already; else what removes the rest of it (a blocking
    /// walk of the tree). Most jobs leave their workspace empty: one rmdir, here, saves
    /// the trip to a blocking thread and back.
    fn removal(&mut self) -> Option<impl FnOnce() + Send + 'static> {
        let path = std::mem::take(&mut self.path);
        let uid = self.uid.take();
        if path.as_os_str().is_empty() {
            return None;
        }
        match std::fs::remove_dir(&path) {
            Ok(()) => return None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(_) => {}
        }
        // The uid goes back (with the last of its holders) once the tree is gone.
        Some(move || {
            if let Err(e) = super::tree::remove_tree(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a workspace");
                if let Some(uid) = &uid {
                    uid.withhold();
                }
            }
            drop(uid);
        })
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let Some(remove) = self.removal() else {
            return;
        };
        // A job may leave thousands of files: remove them off the async threads.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// SIGKILL through `pidfd`: never a recycled pid.
pub(super) fn pidfd_kill(pidfd: BorrowedFd<'_>) -> io::Result<()> {
    pidfd_signal(pidfd, nix::sys::signal::Signal::SIGKILL)
}

fn pidfd_signal(pidfd: BorrowedFd<'_>, sig: nix::sys::signal::Signal) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a pidfd, a signal number and no info.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            0usize,
            0u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives `pid` (a zygote still starting) normal priority: `SCHED_OTHER`, nice 0.
pub(super) fn raise_priority(pid: i32) -> bool {
    set_priority(pid, libc::SCHED_OTHER, 0)
}

/// Back to `SCHED_IDLE` (nice 0, as the zygote puts itself when it is ready).
pub(super) fn lower_priority(pid: i32) -> bool {
    set_priority(pid, libc::SCHED_IDLE, 0)
}

/// Sets `pid`'s scheduling policy and niceness; failure (no CAP_SYS_NICE) changes nothing
/// and is not an error: the worker runs, only at another priority.
fn set_priority(pid: i32, policy: libc::c_int, nice: i32) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler and setpriority with a pid, plain integers and a
    // sched_param we own.
    unsafe {
        libc::sched_setscheduler(pid, policy, &param) == 0
            && libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, nice) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_of(pid: i32) -> libc::c_int {
        // SAFETY: sched_getscheduler takes a pid and returns the policy or -1.
        unsafe { libc::sched_getscheduler(pid) }
    }

    /// The design rests on this: a process put at SCHED_IDLE can be raised back to
    /// SCHED_OTHER by the supervisor when (and only when) it holds CAP_SYS_NICE.
    #[test]
    fn an_idle_process_is_raised_back_with_cap_sys_nice_only() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(
            set_priority(pid, libc::SCHED_IDLE, 19),
            "lowering is always allowed"
        );
        assert_eq!(policy_of(pid), libc::SCHED_IDLE);
        let raised = set_priority(pid, libc::SCHED_OTHER, 0);
        // CAP_SYS_NICE, or without it an RLIMIT_NICE of 20 or more (nice 0).
        let capable = snakecage_worker::capability::can_raise_priority();
        assert_eq!(raised, capable, "raised: {raised}, may raise: {capable}");
        let want = if capable {
            libc::SCHED_OTHER
        } else {
            libc::SCHED_IDLE
        };
        assert_eq!(policy_of(pid), want);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A worker whose exit was reported: asking whether it lives must not lose the status
    /// (the verdict names the signal from it, and SIGXCPU makes it a timeout).
    #[tokio::test]
    async fn asking_whether_a_worker_lives_keeps_its_reported_exit_status() {
        let root = tempfile::tempdir().unwrap();
        let (workspace, _dir) = Workspace::create(root.path(), 1, None).unwrap();
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let (out_r, _out_w) = nix::unistd::pipe().unwrap();
        let (err_r, _err_w) = nix::unistd::pipe().unwrap();
        let (exit_tx, exit) = oneshot::channel();
        let forked = Forked {
            pid: i32::MAX,
            zygote_pid: i32::MAX,
            pidfd: None,
            exit,
            zygote_shut_down: Arc::default(),
        };
        let channel = JobChannel::new(OwnedFd::from(ours)).unwrap();
        let mut worker = Worker::new(
            1,
            0,
            crate::pool::GenerationLease::unattached(1),
            forked,
            channel,
            out_r,
            err_r,
            workspace,
        )
        .unwrap();
        assert!(worker.is_alive());
        exit_tx.send(ExitStatus::Signal(libc::SIGXCPU)).unwrap();
        assert!(!worker.is_alive());
        assert!(!worker.is_alive());
        let status = worker.exit_status(std::time::Duration::ZERO).await;
        assert_eq!(status, Some(ExitStatus::Signal(libc::SIGXCPU)));
    }
}
