//! The isolation steps, one mechanism per file. `child.rs` runs them in order; the zygote
//! runs the once-only ones at start-up.
//!
//! - [`namespaces`]: the zygote's empty network namespace and private mount namespace.
//! - [`fds`], [`rlimits`]: each worker's descriptors and resource limits.
//! - [`privileges`]: the uid/gid drop, no_new_privs.
//! - [`landlock`]: filesystem, network and scope rules.
//! - [`seccomp`]: the syscall policy from `worker/seccomp/`: its bulk installed once in the
//!   zygote and inherited, a small part per worker.
//! - [`layers`]: which layers are active here (probed once at start-up) and how a worker
//!   applies them.

pub mod fds;
pub mod landlock;
pub mod layers;
pub mod namespaces;
pub mod privileges;
pub mod rlimits;
pub mod seccomp;

use std::io;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use snakecage_worker::protocol::ZygoteConfig;

/// Asks the kernel to SIGKILL this process when its parent dies, then checks the parent
/// did not die before the request took effect. With `expected_parent`, a different parent
/// (we were re-parented already) is an error too.
pub fn die_with_parent(expected_parent: Option<Pid>) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    let parent = nix::unistd::getppid();
    let orphaned = match expected_parent {
        Some(expected) => parent != expected,
        None => parent.as_raw() == 1,
    };
    if orphaned {
        return Err(io::Error::other(
            "parent exited before PR_SET_PDEATHSIG took effect",
        ));
    }
    Ok(())
}

/// Points fd 0 at /dev/null, so no process below the zygote can read the supervisor's stdin.
pub fn stdin_from_dev_null() -> io::Result<()> {
    let null = std::fs::File::open("/dev/null")?;
    nix::unistd::dup2_stdin(null)?;
    Ok(())
}

/// Replaces the inherited environment with a fixed, small one before CPython starts, so
/// nothing of the supervisor's environment (credentials, tokens) reaches user code, and
/// numeric libraries stay single-threaded (threads would make fork unsafe).
pub fn fixed_environment(config: &ZygoteConfig) {
    let vars: Vec<(String, std::ffi::OsString)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("OPENBLAS_NUM_THREADS".into(), "1".into()),
        ("OMP_NUM_THREADS".into(), "1".into()),
        ("MKL_NUM_THREADS".into(), "1".into()),
        // numpy sets these two while it imports unless they are set (through os.environ,
        // i.e. putenv, which the audit hook denies in a worker): set here, a worker of a
        // tier that did not preload numpy can still import it.
        ("OPENBLAS_MAIN_FREE".into(), "1".into()),
        ("GOTOBLAS_MAIN_FREE".into(), "1".into()),
        ("MPLBACKEND".into(), "Agg".into()),
        (
            "MPLCONFIGDIR".into(),
            config.mpl_config_dir.clone().into_os_string(),
        ),
    ];
    for (key, _) in std::env::vars_os() {
        // SAFETY: called before CPython starts, while the zygote has a single thread, so no
        // other thread can be reading the environment.
        unsafe { std::env::remove_var(key) };
    }
    for (key, value) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(key, value) };
    }
}

/// Fork is only safe with one thread: a second one could hold a lock (malloc's, the
/// GIL's) that the child would inherit locked forever.
pub fn ensure_single_thread() -> io::Result<()> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "the zygote has {threads} threads, expected 1"
        )));
    }
    Ok(())
}
