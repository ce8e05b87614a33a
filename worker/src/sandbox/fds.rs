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

/// Makes the workspace (fd 4) the current directory, through a path: the supervisor
/// opened it in its own mount namespace, whose mounts may be unreachable from the zygote's
/// private one, and after a plain `fchdir` there `getcwd()` would fail. The path is the
/// supervisor's (`path`, given with the fork) or, without one, the descriptor's path as
/// `/proc` tells it; it is entered, then kept only if it proves to be the directory of
/// fd 4 (same device and inode), else fd 4 is entered as it is.
pub fn enter_workspace(path: Option<&str>) -> io::Result<()> {
    let by_fd = identity(WORKSPACE_FD)?;
    let path = match path {
        Some(path) => std::path::PathBuf::from(path),
        None => match std::fs::read_link(format!("/proc/self/fd/{WORKSPACE_FD}")) {
            Ok(path) => path,
            Err(_) => return fchdir_workspace(),
        },
    };
    if path.is_absolute()
        && std::env::set_current_dir(&path).is_ok()
        && identity(libc::AT_FDCWD).ok() == Some(by_fd)
    {
        return Ok(());
    }
    fchdir_workspace()
}

/// `(st_dev, st_ino)` of a descriptor (`AT_FDCWD`: the current directory).
fn identity(fd: RawFd) -> io::Result<(libc::dev_t, libc::ino_t)> {
    // SAFETY: `stat` is plain old data, for which all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat with an empty path and AT_EMPTY_PATH on `fd` into the buffer above.
    if unsafe { libc::fstatat(fd, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

fn fchdir_workspace() -> io::Result<()> {
    // SAFETY: fd 4 is the workspace directory, placed by `arrange`.
    if unsafe { libc::fchdir(WORKSPACE_FD) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::path::{Path, PathBuf};

    use super::*;

    /// In a forked child (the current directory is the whole process's): `dir` opened as
    /// fd 4, then `enter_workspace(given)`; the directory it ended in, by device and
    /// inode, and whether `getcwd` names `dir`.
    fn entered(dir: &Path, given: Option<&str>) -> (bool, bool) {
        let file = std::fs::File::open(dir).unwrap();
        let want = identity(file.as_raw_fd()).unwrap();
        // SAFETY: the child only duplicates a descriptor, changes directory, stats and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: fd 4 of this child alone; `file` stays open until _exit.
            let code = if unsafe { libc::dup2(file.as_raw_fd(), WORKSPACE_FD) } < 0 {
                9
            } else if enter_workspace(given).is_err() {
                8
            } else {
                let same = identity(libc::AT_FDCWD).ok() == Some(want);
                let named = std::env::current_dir().ok() == Some(dir.to_path_buf());
                i32::from(same) * 2 + i32::from(named)
            };
            // SAFETY: ends the child without running the harness's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        let code = libc::WEXITSTATUS(status);
        assert!(code < 4, "the child failed at step {code}");
        (code & 2 != 0, code & 1 != 0)
    }

    #[test]
    fn the_workspace_is_entered_through_a_path_only_if_it_is_the_descriptors_directory() {
        let base = tempfile::tempdir().unwrap();
        let dir: PathBuf = base.path().join("w1 ü");
        let other = base.path().join("w2");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&other).unwrap();
        let dir = dir.canonicalize().unwrap();
        let given = dir.to_str().unwrap();
        // The supervisor's path, or /proc's.
        assert_eq!(entered(&dir, Some(given)), (true, true));
        assert_eq!(entered(&dir, None), (true, true));
        // A path to another directory, or a relative one: the descriptor's directory all
        // the same (named by getcwd here, where both share a mount namespace).
        let other = other.canonicalize().unwrap();
        assert_eq!(entered(&dir, Some(other.to_str().unwrap())), (true, true));
        assert_eq!(entered(&dir, Some("w1 ü")), (true, true));
        assert_eq!(entered(&dir, Some("/no/such/dir")), (true, true));
    }
}
