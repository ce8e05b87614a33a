//! The worker's file descriptors: exactly 0 = /dev/null, 1 = stdout pipe, 2 = stderr pipe,
//! 3 = job socket, 4 = workspace directory. Everything else inherited from the zygote (its
//! control socket, its signalfd) is closed: at once, but for the descriptors the zygote
//! opened once for its workers' hardening (Landlock's rule paths, the cgroup's files),
//! which are closed once the layers are on.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

pub const JOB_FD: RawFd = 3;
pub const WORKSPACE_FD: RawFd = 4;
/// The first descriptor above the fixed ones.
pub const FIRST_FREE: RawFd = WORKSPACE_FD + 1;

/// Places `[job, stdout, stderr, workspace]` on their fixed numbers and closes the rest
/// but `keep` (sorted descriptors at or above [`FIRST_FREE`], which [`close_inherited`]
/// closes later; sorted once in the zygote, so a worker allocates nothing for them).
pub fn arrange(fds: [OwnedFd; 4], keep: &[RawFd]) -> io::Result<()> {
    // Move every source above the targets first, so no dup2 below overwrites a source.
    let mut high = Vec::with_capacity(4);
    for fd in &fds {
        // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd >= 10 or -1.
        let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        high.push(dup);
    }
    drop(fds);
    let [job, stdout, stderr, workspace] = [high[0], high[1], high[2], high[3]];
    for (src, dst) in [
        (stdout, 1),
        (stderr, 2),
        (job, JOB_FD),
        (workspace, WORKSPACE_FD),
    ] {
        // SAFETY: both are valid fd numbers; dup2 onto a target atomically replaces it and
        // clears close-on-exec on the copy.
        if unsafe { libc::dup2(src, dst) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    debug_assert!(keep.is_sorted(), "{keep:?}");
    let mut from = FIRST_FREE;
    for &fd in keep.iter().filter(|&&fd| fd >= FIRST_FREE) {
        if fd > from {
            close_range(from, fd - 1)?;
        }
        from = fd + 1;
    }
    close_range(from, RawFd::MAX)
}

/// `fd`, moved above the fixed descriptors when it is one of them: for a descriptor the
/// zygote opens for its workers, which [`arrange`] must not overwrite.
pub fn above_fixed(fd: OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd.as_raw_fd() >= FIRST_FREE {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd >= FIRST_FREE, or -1.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, FIRST_FREE) };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor just returned is ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// Closes every descriptor above the fixed ones: what [`arrange`] kept.
pub fn close_inherited() -> io::Result<()> {
    close_range(FIRST_FREE, RawFd::MAX)
}

fn close_range(first: RawFd, last: RawFd) -> io::Result<()> {
    // SAFETY: closes fds first..=last in this process; nothing below relies on any of
    // them (the Rust objects that owned the originals were dropped above, and the kept
    // ones are never closed through an owner in a worker).
    if unsafe { libc::close_range(first as u32, last as u32, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the workspace (fd 4) the current directory. The supervisor opened it in its own
/// mount namespace, whose mounts are unreachable from the zygote's private one, so after a
/// plain `fchdir` `getcwd()` would fail. The same directory is therefore entered again
/// through its path in this namespace, once that path is proven to be the same inode.
pub fn enter_workspace() -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: fd 4 is the workspace directory, placed by `arrange`.
    if unsafe { libc::fchdir(WORKSPACE_FD) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{WORKSPACE_FD}")) else {
        return Ok(());
    };
    // SAFETY: fstat on fd 4 into a zeroed stat buffer we own.
    let by_fd = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(WORKSPACE_FD, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    };
    let by_path = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
    if path.is_absolute() && by_fd.is_some() && by_fd == by_path {
        std::env::set_current_dir(&path)?;
    }
    Ok(())
}
