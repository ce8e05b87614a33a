//! The control socket: supervisor → zygote [`ControlRequest`], zygote → supervisor
//! [`ControlReply`], and what the zygote reports about itself and its children.

use serde::{Deserialize, Serialize};

use super::LayerReport;

/// supervisor → zygote.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Fork one worker. Attached fds, in order: the worker's end of its job socket, the
    /// write ends of its stdout and stderr pipes, and its workspace directory. Without
    /// `warm_up` the child skips its tier's warm-up jobs: a job is already waiting for it,
    /// so their first-use costs would be paid on that job's time anyway, and twice.
    /// `uid`: the uid this worker drops to, one no other live worker has (the supervisor
    /// allocates it); `None`: the configured `sandbox.uid`. `workspace`: the path of the
    /// workspace directory as the supervisor made it, which the worker enters once it has
    /// proven it the directory of the attached descriptor; `None` (a path that is not
    /// UTF-8): the worker asks `/proc` for the descriptor's path instead.
    Fork {
        worker_id: u64,
        warm_up: bool,
        #[serde(default)]
        uid: Option<u32>,
        #[serde(default)]
        workspace: Option<String>,
    },
    /// Kill every child, reap them, exit.
    Shutdown,
}

/// Number of fds attached to [`ControlRequest::Fork`].
pub const FORK_FDS: usize = 4;

/// zygote → supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlReply {
    /// Sent once, when the zygote is initialised and ready to fork.
    Hello(ZygoteInfo),
    /// The worker exists. A pidfd for it is attached when the kernel supports pidfds.
    Forked {
        worker_id: u64,
        pid: i32,
    },
    ForkFailed {
        worker_id: u64,
        reason: String,
    },
    /// A child was reaped.
    Exited {
        pid: i32,
        status: ExitStatus,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ZygoteInfo {
    pub pid: i32,
    pub python_version: String,
    /// Preloaded modules that imported, with their versions where they have one.
    pub preloaded: Vec<PreloadedModule>,
    /// Preloaded modules that failed to import, with the error.
    pub preload_failures: Vec<String>,
    /// Every isolation layer, as probed at start-up.
    #[serde(default)]
    pub sandbox: Vec<LayerReport>,
    /// Each allowed third-party package: installed or not, and its version.
    #[serde(default)]
    pub packages: Vec<PackageInfo>,
}

/// An allowed third-party package as the zygote found it (without importing it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PackageInfo {
    /// The top-level import name (`PIL`), not the distribution's (`pillow`).
    pub name: String,
    pub installed: bool,
    /// The version of the distribution that provides it, when its metadata says.
    pub version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PreloadedModule {
    pub name: String,
    pub version: Option<String>,
}

/// How a child ended, as `waitpid` reported it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}
