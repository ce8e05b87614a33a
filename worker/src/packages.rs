//! The scan of the allowed packages (installed or not, which version), run in a
//! throwaway child of the zygote so that what it imports never enters the zygote's heap.
//!
//! The scan needs `importlib.metadata`, which brings ~80 modules with it (`email`,
//! `zipfile`, `tempfile`, `threading`, `random`, …). Imported in the zygote itself, they
//! would double the lightest tier's heap, and `threading`'s and `random`'s at-fork hooks
//! would run in every worker it forks: about 0.7 ms of CPU per stateless request, spent
//! copying pages no job asked for.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use snakecage_worker::protocol::PackageInfo;

use crate::interpreter::{InterpreterError, Runner};
use crate::zygote::fork_interpreter;

/// What the scan's child writes to its pipe: the packages, or why it could not.
type Outcome = Result<Vec<PackageInfo>, String>;

/// A scan running in its child while the zygote goes on with its preloads: on a machine
/// with a CPU to spare the scan costs the zygote's start-up nothing.
pub struct Scan {
    pid: i32,
    read: OwnedFd,
}

/// Forks the child that runs `runner.describe_packages(names)`. The child needs nothing
/// the preloads bring, so this is called before them, while the zygote is smallest.
pub fn start(runner: &Runner<'_>, names: &[String]) -> Result<Scan, InterpreterError> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| failed(format!("creating its pipe: {e}")))?;
    // The parent's write end goes with the closure once the fork is made: the read in
    // `finish` ends when the child's does.
    let pid = fork_interpreter(move || scan_and_exit(runner, names, write))
        .map_err(|e| failed(e.to_string()))?;
    Ok(Scan { pid, read })
}

impl Scan {
    /// Waits for the child's result and reaps it.
    pub fn finish(self) -> Result<Vec<PackageInfo>, InterpreterError> {
        let mut bytes = Vec::new();
        let read_result = std::fs::File::from(self.read).read_to_end(&mut bytes);
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
        read_result.map_err(|e| failed(format!("reading its result: {e}")))?;
        match serde_json::from_slice::<Outcome>(&bytes) {
            Ok(Ok(packages)) => Ok(packages),
            Ok(Err(reason)) => Err(failed(reason)),
            Err(_) => Err(failed(format!(
                "its process ended ({status:?}) without a result"
            ))),
        }
    }
}

fn failed(reason: String) -> InterpreterError {
    InterpreterError::PackageScan(reason)
}

/// The child's side: scan, write the outcome, exit without running any teardown.
fn scan_and_exit(runner: &Runner<'_>, names: &[String], write: OwnedFd) -> ! {
    let outcome: Outcome = runner.describe_packages(names).map_err(|e| e.to_string());
    let code = match serde_json::to_vec(&outcome) {
        Ok(bytes) => match std::fs::File::from(write).write_all(&bytes) {
            Ok(()) => 0,
            Err(_) => 1,
        },
        Err(_) => 1,
    };
    // SAFETY: `_exit` ends this forked child at once: no atexit handlers, no CPython
    // finalisation, no destructors of state it shares with the zygote.
    unsafe { libc::_exit(code) }
}
