//! The zygote process as the supervisor sees it: started with exec (never forked from
//! this threaded process), one control socket, replies routed to whoever waits for them.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use snakecage_worker::fdpass::{self, Record};
use snakecage_worker::frame::{self, MAX_FRAME_LEN};
use snakecage_worker::protocol::{
    ControlReply, ControlRequest, ExitStatus, ZygoteConfig, ZygoteInfo,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, oneshot};

use super::uids::{UidLease, release_when_gone};

/// The zygote's replies are small; a bigger record is a protocol violation.
const MAX_REPLY: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error("cannot start the zygote {binary}: {source}")]
    Spawn { binary: String, source: io::Error },
    #[error("the zygote exited before it was ready{}", stderr_hint(.0))]
    DiedDuringStartup(Option<String>),
    #[error("the zygote did not become ready within {0:?}")]
    StartupTimeout(Duration),
    #[error("the zygote is gone")]
    Gone,
    #[error("the zygote could not fork: {0}")]
    ForkFailed(String),
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    #[error("the zygote broke the control protocol: {0}")]
    Protocol(String),
}

fn stderr_hint(s: &Option<String>) -> String {
    s.as_ref().map(|s| format!(": {s}")).unwrap_or_default()
}

/// A forked worker, as the zygote reported it.
pub struct Forked {
    pub pid: i32,
    /// Its zygote's pid: the process that reaps it and reports its exit.
    pub zygote_pid: i32,
    pub pidfd: Option<OwnedFd>,
    /// Fires with the exit status once the zygote reaps the worker; closes if the zygote dies.
    pub exit: oneshot::Receiver<ExitStatus>,
    /// Set once its zygote is told to shut down: whether the zygote, if it is gone, was
    /// told to go.
    pub zygote_shut_down: Arc<AtomicBool>,
}

type ForkReply = Result<Forked, ZygoteError>;

/// Each fork and each exit the zygote has yet to report, with the worker's uid: held until
/// the zygote reports the worker reaped (or the fork failed), so the id is not handed to
/// another worker while a process or thread of this one may remain.
#[derive(Default)]
struct Routes {
    /// The zygote's pid, which every worker it forks is told.
    zygote_pid: i32,
    forks: HashMap<u64, (oneshot::Sender<ForkReply>, Option<Arc<UidLease>>)>,
    exits: HashMap<i32, (oneshot::Sender<ExitStatus>, Option<Arc<UidLease>>)>,
}

/// One running zygote. Dropping the last handle does not kill it; [`ZygoteHandle::shutdown`]
/// or the supervisor's exit does (the zygote has PDEATHSIG).
pub struct ZygoteHandle {
    /// How many times its tier's zygote had been restarted (within its pool generation)
    /// when this one started: 0 for the first, one more per restart (`/health` shows it as
    /// `restarts`). Its workers carry it, so that workers of a zygote since replaced are
    /// not handed out.
    pub restarts: u64,
    pub info: ZygoteInfo,
    sock: Arc<AsyncFd<OwnedFd>>,
    routes: Arc<Mutex<Routes>>,
    alive: Arc<AtomicBool>,
    /// Set once the supervisor tells it to shut down, which kills its workers: only when
    /// the service stops does that happen to a zygote with a worker in use (a retired
    /// generation's zygotes are shut down once no worker holds its lease).
    shut_down: Arc<AtomicBool>,
    died: Arc<Notify>,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ZygoteHandle {
    /// Execs the zygote and waits for its Hello. With `background` (a rollover's zygote,
    /// started while the current generation serves), it runs at `SCHED_IDLE` from its first
    /// instruction (interpreter start-up, preloads, warm-up all yield to live requests), and
    /// is raised to normal priority if it has not said Hello after that long; without
    /// CAP_SYS_NICE (which raising needs) it starts at normal priority, as before.
    pub async fn start(
        binary: &std::path::Path,
        config: &ZygoteConfig,
        restarts: u64,
        startup_timeout: Duration,
        background: Option<Duration>,
    ) -> Result<Arc<Self>, ZygoteError> {
        // Idle only if it can be raised again: nothing else could bring it back.
        let background = background.filter(|_| snakecage_worker::capability::can_raise_priority());
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(io::Error::from)?;
        // The zygote's end is blocking (it polls); ours stays non-blocking for AsyncFd.
        set_blocking(&theirs)?;
        let json =
            serde_json::to_string(config).map_err(|e| ZygoteError::Protocol(e.to_string()))?;
        let mut cmd = tokio::process::Command::new(binary);
        cmd.arg("--control-fd").arg("3").arg("--config").arg(json);
        // The zygote's own stdout would mix with ours; its stray prints go to our stderr.
        let stderr_copy = io::stderr().as_fd().try_clone_to_owned()?;
        // Every symbol bound when the zygote starts, once: lazily bound, each worker would
        // resolve the libc functions CPython first calls after fork itself, writing to the
        // shared GOT pages (~25 copy-on-write faults, ~0.1 ms of CPU per worker). The zygote
        // clears its environment first thing, so workers never see the variable.
        cmd.env("LD_BIND_NOW", "1");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(stderr_copy))
            .stderr(Stdio::piped());
        cmd.kill_on_drop(true);
        // Its own process group: a terminal's Ctrl-C (SIGINT to the foreground group) must
        // reach only the supervisor, which then shuts down in order, not interrupt jobs.
        cmd.process_group(0);
        let theirs_raw = theirs.as_raw_fd();
        let idle = background.is_some();
        // SAFETY: runs in the forked child before exec; dup2, fcntl and sched_setscheduler
        // are async-signal-safe and touch only that child (its fds, its own policy).
        unsafe {
            cmd.pre_exec(move || {
                if idle {
                    let param = libc::sched_param { sched_priority: 0 };
                    // Failure only costs latency: the zygote starts at normal priority.
                    libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
                }
                if theirs_raw == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(theirs_raw, 3) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| ZygoteError::Spawn {
            binary: binary.display().to_string(),
            source,
        })?;
        drop(theirs);
        let stderr = child.stderr.take();
        let sock = Arc::new(super::fd::async_fd(ours)?);
        // Not reaped before `child` is waited on (after its reader ends): the pid is its own.
        let exited = child
            .id()
            .and_then(|pid| fdpass::pidfd_open(pid as i32))
            .and_then(|fd| super::fd::async_fd(fd).ok());

        // Forward the zygote's stderr (worker start-up errors, Python warnings) to our log.
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = stderr {
            tokio::spawn(forward_stderr(stderr, stderr_tail.clone()));
        }

        let mut buf = vec![0u8; MAX_REPLY];
        let hello = tokio::time::timeout(startup_timeout, recv(&sock, &mut buf));
        let hello = async {
            tokio::pin!(hello);
            let Some(patience) = background else {
                return hello.await;
            };
            tokio::select! {
                reply = &mut hello => return reply,
                () = tokio::time::sleep(patience) => {}
            }
            // Not reaped before `child` is waited on below: the pid is still this zygote's.
            if let Some(pid) = child.id() {
                tracing::info!(
                    pid,
                    ?patience,
                    "a new zygote is still starting at idle priority: raised to normal"
                );
                super::worker::raise_priority(pid as i32);
            }
            hello.await
        };
        let info = match hello.await {
            Err(_) => return Err(ZygoteError::StartupTimeout(startup_timeout)),
            Ok(Ok(Some((ControlReply::Hello(info), _)))) => info,
            Ok(Ok(None)) => {
                let _ = child.wait().await;
                tokio::time::sleep(Duration::from_millis(50)).await; // let stderr drain
                let tail = stderr_tail.lock().expect("stderr tail").trim().to_owned();
                return Err(ZygoteError::DiedDuringStartup(
                    (!tail.is_empty()).then_some(tail),
                ));
            }
            Ok(Ok(Some((other, _)))) => {
                return Err(ZygoteError::Protocol(format!(
                    "expected hello, got {other:?}"
                )));
            }
            Ok(Err(e)) => return Err(e),
        };
        let zygote_pid = info.pid;
        let handle = Arc::new(Self {
            restarts,
            info,
            sock: sock.clone(),
            routes: Arc::new(Mutex::new(Routes {
                zygote_pid,
                ..Routes::default()
            })),
            alive: Arc::new(AtomicBool::new(true)),
            shut_down: Arc::new(AtomicBool::new(false)),
            died: Arc::new(Notify::new()),
            reader: Mutex::new(None),
        });
        let reader = tokio::spawn(read_replies(
            sock,
            exited,
            handle.routes.clone(),
            handle.alive.clone(),
            handle.shut_down.clone(),
            handle.died.clone(),
            child,
        ));
        *handle.reader.lock().expect("reader lock") = Some(reader);
        Ok(handle)
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Resolves when the zygote has died (immediately if it already has).
    pub async fn died(&self) {
        let notified = self.died.notified();
        if !self.is_alive() {
            return;
        }
        notified.await;
    }

    /// Asks for one worker; `fds` are its job socket, stdout and stderr write ends and its
    /// workspace directory (at `workspace`), closed here once sent. `warm_up: false` skips
    /// the tier's warm-up jobs in it. `uid`: the worker's own uid, held here until it is
    /// reaped.
    pub async fn fork(
        &self,
        worker_id: u64,
        warm_up: bool,
        uid: Option<Arc<UidLease>>,
        fds: [OwnedFd; 4],
        workspace: &Path,
    ) -> Result<Forked, ZygoteError> {
        let (tx, rx) = oneshot::channel();
        let request = ControlRequest::Fork {
            worker_id,
            warm_up,
            uid: uid.as_ref().map(|lease| lease.uid()),
            workspace: workspace.to_str().map(str::to_owned),
        };
        {
            let mut routes = self.routes.lock().expect("routes lock");
            if !self.is_alive() {
                return Err(ZygoteError::Gone);
            }
            routes.forks.insert(worker_id, (tx, uid));
        }
        if let Err(e) = self.send(&request, &fds).await {
            self.routes
                .lock()
                .expect("routes lock")
                .forks
                .remove(&worker_id);
            return Err(e);
        }
        drop(fds);
        rx.await.map_err(|_| ZygoteError::Gone)?
    }

    async fn send(&self, request: &ControlRequest, fds: &[OwnedFd]) -> Result<(), ZygoteError> {
        let bytes = frame::encode(request).map_err(|e| ZygoteError::Protocol(e.to_string()))?;
        let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
        let sock = self.sock.get_ref().as_fd();
        loop {
            match fdpass::send_record(sock, &bytes, &borrowed) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    super::fd::writable(sock).await?
                }
                Err(e) if is_gone(&e) => return Err(ZygoteError::Gone),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Asks the zygote to kill and reap every worker and exit, then waits for it (bounded).
    pub async fn shutdown(&self, wait: Duration) {
        self.shut_down.store(true, Ordering::Release);
        let _ = self.send(&ControlRequest::Shutdown, &[]).await;
        let reader = self.reader.lock().expect("reader lock").take();
        if let Some(reader) = reader {
            let _ = tokio::time::timeout(wait, reader).await;
        }
    }
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)
    )
}

fn set_blocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a valid fd we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one reply; `Ok(None)` when the zygote closed its end.
async fn recv(
    sock: &AsyncFd<OwnedFd>,
    buf: &mut [u8],
) -> Result<Option<(ControlReply, Vec<OwnedFd>)>, ZygoteError> {
    loop {
        let mut guard = sock.readable().await?;
        let rec: Record =
            match guard.try_io(|sock| fdpass::recv_record(sock.get_ref().as_fd(), buf)) {
                Ok(Ok(rec)) => rec,
                Ok(Err(e)) if is_gone(&e) => return Ok(None),
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => continue,
            };
        return reply(rec, buf);
    }
}

/// The reply a record holds; `Ok(None)` for the empty record of a closed socket.
fn reply(rec: Record, buf: &[u8]) -> Result<Option<(ControlReply, Vec<OwnedFd>)>, ZygoteError> {
    if rec.bytes == 0 && rec.fds.is_empty() {
        return Ok(None);
    }
    let reply = frame::decode_exact(&buf[..rec.bytes], MAX_FRAME_LEN.min(MAX_REPLY))
        .map_err(|e| ZygoteError::Protocol(e.to_string()))?;
    Ok(Some((reply, rec.fds)))
}

/// A reply already in the socket, without waiting; `None` when there is none (or the rest
/// cannot be read: the zygote is gone either way).
fn recv_now(sock: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> Option<(ControlReply, Vec<OwnedFd>)> {
    let rec = fdpass::recv_record(sock.get_ref().as_fd(), buf).ok()?;
    reply(rec, buf).ok().flatten()
}

/// Routes replies until the zygote goes away, then fails everyone still waiting and reaps it.
///
/// Gone is when its process has exited (`exited`, its pidfd, turns readable), not only when
/// its socket closes: a child it forked holds the socket until it has closed the fds it
/// inherited, and one forked just before the zygote died, at background priority on a busy
/// host, could keep it open for seconds. Until the death is read, its idle workers count as
/// alive and a job whose worker died with it could not tell why.
async fn read_replies(
    sock: Arc<AsyncFd<OwnedFd>>,
    exited: Option<AsyncFd<OwnedFd>>,
    routes: Arc<Mutex<Routes>>,
    alive: Arc<AtomicBool>,
    shut_down: Arc<AtomicBool>,
    died: Arc<Notify>,
    mut child: tokio::process::Child,
) {
    let mut buf = vec![0u8; MAX_REPLY];
    loop {
        let received = tokio::select! {
            received = recv(&sock, &mut buf) => received,
            _ = async { exited.as_ref()?.readable().await.ok() }, if exited.is_some() => {
                // What it sent before it died is still in the socket.
                while let Some((reply, fds)) = recv_now(&sock, &mut buf) {
                    route(&routes, &shut_down, reply, fds);
                }
                break;
            }
        };
        match received {
            Ok(Some((reply, fds))) => route(&routes, &shut_down, reply, fds),
            Ok(None) => break,
            Err(e) => {
                tracing::error!(error = %e, "zygote control socket failed; restarting the zygote");
                break;
            }
        }
    }
    let orphaned_uids = {
        // Fail pending forks and close exit channels: waiters see the zygote is gone.
        let mut routes = routes.lock().expect("routes lock");
        alive.store(false, Ordering::Release);
        let routes = &mut *routes;
        let forks = routes.forks.drain().map(|(_, (_, uid))| (None, uid));
        let exits = routes.exits.drain().map(|(pid, (_, uid))| (Some(pid), uid));
        let orphans = forks.chain(exits);
        orphans
            .filter_map(|(pid, uid)| Some((pid, uid?)))
            .collect::<Vec<_>>()
    };
    died.notify_waiters();
    let _ = child.start_kill();
    match child.wait().await {
        Ok(status) => tracing::info!(%status, "zygote exited"),
        Err(e) => tracing::warn!(error = %e, "waiting for the zygote failed"),
    }
    // Its workers were killed with it, and are reaped by whoever inherits them; their uids
    // wait until they are gone. Only now that it is reaped: its socket closes (and the
    // loop above ends) before the kernel has told its children of its death. Until then
    // a child forked just before, still root and busy with its hardening, goes on to take
    // its uid and live under it; a scan made in between would not see it under that uid,
    // give the uid back, and leave it, once killed, to linger unreaped and unwatched.
    release_when_gone(orphaned_uids);
}

fn route(
    routes: &Mutex<Routes>,
    shut_down: &Arc<AtomicBool>,
    reply: ControlReply,
    fds: Vec<OwnedFd>,
) {
    let mut routes = routes.lock().expect("routes lock");
    match reply {
        ControlReply::Forked { worker_id, pid } => {
            let (exit_tx, exit_rx) = oneshot::channel();
            let (tx, uid) = match routes.forks.remove(&worker_id) {
                Some((tx, uid)) => (Some(tx), uid),
                None => (None, None),
            };
            routes.exits.insert(pid, (exit_tx, uid));
            let forked = Forked {
                pid,
                zygote_pid: routes.zygote_pid,
                pidfd: fds.into_iter().next(),
                exit: exit_rx,
                zygote_shut_down: shut_down.clone(),
            };
            if let Some(tx) = tx {
                let _ = tx.send(Ok(forked));
            }
        }
        ControlReply::ForkFailed { worker_id, reason } => {
            // No process was made: its uid is free again.
            if let Some((tx, _uid)) = routes.forks.remove(&worker_id) {
                let _ = tx.send(Err(ZygoteError::ForkFailed(reason)));
            }
        }
        ControlReply::Exited { pid, status } => {
            // Reaped: no process or thread of it is left, and its uid may serve again once
            // its workspace is removed too.
            if let Some((tx, _uid)) = routes.exits.remove(&pid) {
                let _ = tx.send(status);
            }
        }
        ControlReply::Hello(_) => tracing::warn!("zygote sent a second hello; ignored"),
    }
}

/// Logs each line the zygote (or a worker before its pipes are set up) writes to stderr,
/// keeping the last few for start-up error reports.
async fn forward_stderr(stderr: tokio::process::ChildStderr, tail: Arc<Mutex<String>>) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::warn!(target: "snakecage::zygote", "{line}");
        let mut tail = tail.lock().expect("stderr tail");
        tail.push_str(&line);
        tail.push('\n');
        if tail.len() > 4096 {
            *tail = super::capture::last_lines(&tail, 4096);
        }
    }
}
