//! Dropping root: no supplementary groups, then the gid, then the uid (in that order: once
//! the uid is gone the others can no longer be changed). Then `PR_SET_NO_NEW_PRIVS`, so no
//! later execve could regain privileges (and Landlock and seccomp may be installed
//! unprivileged), and not dumpable, so no process of the worker's uid (a worker that had
//! it before, the zygote's start-up probe) can ptrace it or read its /proc files.

use std::io;

use nix::unistd::{Gid, Uid, getgid, getuid, setgroups, setresgid, setresuid};

/// True when this process can (and so should) drop to another uid.
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn drop_to(uid: u32, gid: u32) -> io::Result<()> {
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    setgroups(&[]).map_err(|e| io::Error::other(format!("setgroups([]): {e}")))?;
    setresgid(gid, gid, gid).map_err(|e| io::Error::other(format!("setresgid({gid}): {e}")))?;
    setresuid(uid, uid, uid).map_err(|e| io::Error::other(format!("setresuid({uid}): {e}")))?;
    // Regaining root must be impossible now; check rather than trust.
    if getuid() != uid || getgid() != gid || setresuid(Uid::from_raw(0), uid, uid).is_ok() {
        return Err(io::Error::other("the uid drop did not stick"));
    }
    Ok(())
}

pub fn no_new_privs() -> io::Result<()> {
    nix::sys::prctl::set_no_new_privs()?;
    nix::sys::prctl::set_dumpable(false)?;
    if !nix::sys::prctl::get_no_new_privs()? {
        return Err(io::Error::other("PR_SET_NO_NEW_PRIVS did not stick"));
    }
    Ok(())
}
