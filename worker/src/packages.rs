//! The scan of the allowed packages (installed or not, which version), run in a
//! throwaway child of the zygote so that what it imports never enters the zygote's heap.
//!
//! Whether a package is installed is `importlib.util.find_spec`'s answer on the zygote's
//! own `sys.path`: exactly what an import would find, a namespace package, a module no
//! distribution names or a standard-library module included. Its version is read from
//! the `.dist-info` files in Rust ([`snakecage_worker::distinfo`]), not with
//! `importlib.metadata`: that module alone brings ~80 modules (`email`, `zipfile`,
//! `threading`, …) and reads every `RECORD` of the environment through them, ~0.25 s of
//! CPU on the path to the service's readiness (the lightest zygote preloads nothing, so
//! it waits for its scan). Without it the child's work is a few milliseconds; it still
//! runs apart because `importlib.util` and the finders' directory caches would otherwise
//! stay in every worker's copy of the heap.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use pyo3::exceptions::{PyImportError, PyValueError};
use pyo3::prelude::*;
use snakecage_worker::distinfo;
use snakecage_worker::protocol::PackageInfo;

use crate::interpreter::InterpreterError;
use crate::sandbox::OwnStatus;
use crate::zygote::fork_interpreter;

/// What the scan's child writes to its pipe: the packages, or why it could not.
type Outcome = Result<Vec<PackageInfo>, String>;

/// A scan running in its child while the zygote goes on with its preloads: on a machine
/// with a CPU to spare the scan costs the zygote's start-up nothing.
pub struct Scan {
    pid: i32,
    read: OwnedFd,
}

/// Forks the child that describes `names`. The child needs nothing the preloads bring,
/// so this is called before them, while the zygote is smallest.
pub fn start(py: Python<'_>, names: &[String]) -> Result<Scan, InterpreterError> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| failed(format!("creating its pipe: {e}")))?;
    // The parent's write end goes with the closure once the fork is made: the read in
    // `finish` ends when the child's does.
    let own = OwnStatus::open().map_err(|e| failed(format!("reading /proc/self/status: {e}")))?;
    let pid = fork_interpreter(&own, move |_| scan_and_exit(py, names, write))
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

/// Each of `names`, in order: whether `find_spec` finds it, and the version the files of
/// the distribution providing it declare.
fn describe(py: Python<'_>, names: &[String]) -> PyResult<Vec<PackageInfo>> {
    let util = py.import("importlib.util")?;
    let suffixes: Vec<String> = py
        .import("importlib.machinery")?
        .call_method0("all_suffixes")?
        .extract()?;
    // The distributions `importlib.metadata` would look at: those on `sys.path`.
    let path: Vec<PathBuf> = py
        .import("sys")?
        .getattr("path")?
        .try_iter()?
        .filter_map(|entry| entry.ok()?.extract().ok())
        .collect();
    let versions = distinfo::versions_of(&path, names, &suffixes);
    names
        .iter()
        .zip(versions)
        .map(|(name, version)| {
            let installed = match util.call_method1("find_spec", (name,)) {
                Ok(spec) => !spec.is_none(),
                // A dotted name whose parent does not import, or a relative or empty one.
                Err(e) if e.is_instance_of::<PyImportError>(py) => false,
                Err(e) if e.is_instance_of::<PyValueError>(py) => false,
                Err(e) => return Err(e),
            };
            Ok(PackageInfo {
                name: name.clone(),
                installed,
                version,
            })
        })
        .collect()
}

/// The child's side: scan, write the outcome, exit without running any teardown.
fn scan_and_exit(py: Python<'_>, names: &[String], write: OwnedFd) -> ! {
    let outcome: Outcome =
        describe(py, names).map_err(|e| format!("describing the allowed packages: {e}"));
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
