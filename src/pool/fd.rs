//! The supervisor's ends of a worker's pipes and sockets: registering fds with the tokio
//! reactor, non-blocking pipes and reads. Below both `worker` and `zygote`, which use it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Registers an fd with the tokio reactor for readability only.
///
/// A Unix socket registered for writability too would wake the reactor each time its peer
/// reads a message: the kernel signals "writable" whenever the peer frees buffer space,
/// whether or not anything waits to write. A worker reading its job and a zygote reading a
/// fork request cost the supervisor one needless wake-up each per request. Writers try
/// first and wait with [`writable`] only when the socket is full.
pub(super) fn async_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    register(fd, Interest::READABLE)
}

/// Waits until `fd` (registered readable-only by [`async_fd`]) has room to write: a
/// duplicate is registered for writability for as long as this waits. A new registration
/// reports the socket's present state, so room made before it is not missed.
pub(super) async fn writable(fd: BorrowedFd<'_>) -> io::Result<()> {
    let registered = register(fd.try_clone_to_owned()?, Interest::WRITABLE)?;
    let _ready = registered.writable().await?;
    Ok(())
}

fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open fd and returns the same number for as long as it
    // lives; the AsyncFd takes ownership of it, so it stays open while registered.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}

/// Non-blocking read from a pipe or socket the supervisor owns.
pub(super) fn read_nonblocking(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    let n = nix::unistd::read(fd.get_ref().as_fd(), buf)?;
    Ok(n)
}

/// A pipe whose read end (ours) is non-blocking and whose write end (the worker's) blocks.
pub(super) fn nonblocking_read_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let flags = nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok((r, w))
}

/// What a dead worker left in its stderr pipe (why it failed to start), bounded.
pub(super) fn read_available(fd: &AsyncFd<OwnedFd>) -> String {
    let mut buf = vec![0u8; 4096];
    let n = read_nonblocking(fd, &mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).trim().to_owned()
}
