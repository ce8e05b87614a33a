//! The zygote's start-up configuration: what it preloads, how its children warm up, the
//! limits every worker applies to itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::SandboxConfig;

/// Everything the zygote needs before it initialises CPython; passed as JSON on its
/// command line by the supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ZygoteConfig {
    /// CPython's prefix (`sys.base_prefix`); `None`: the one the zygote was built against.
    pub python_home: Option<PathBuf>,
    /// Appended to `sys.path` after start-up (`site` is off).
    pub site_packages: Vec<PathBuf>,
    /// The pool tier this zygote serves (its name in logs and reports).
    #[serde(default)]
    pub tier: String,
    /// Modules imported once in the zygote so every child has them for free.
    pub preload: Vec<String>,
    /// The representative work each child runs before it says Ready, so a request does
    /// not pay its first-use costs (cold caches, copy-on-write faults, font loading).
    #[serde(default)]
    pub warm_up: Vec<WarmUp>,
    /// Whether this zygote reports which allowed packages are installed (`packages` in
    /// its hello). The scan (`find_spec` for each, the `.dist-info` files read for their
    /// versions) runs in a child beside the zygote's preloads; the packages are the same
    /// for every tier, so only one tier does it.
    #[serde(default = "yes")]
    pub describe_packages: bool,
    /// The niceness the zygote prepares at (imports, warm-up, freeze), before it lowers
    /// itself to background priority to fork. The supervisor starts every zygote but the
    /// lightest (which `/ready` waits for) and the fullest (which takes longest) at 10: on
    /// a small machine they would otherwise take CPU from those two.
    #[serde(default)]
    pub startup_nice: i32,
    /// Map the heap back from a memfd snapshot once it is built (`snapshot.rs`): cheaper
    /// fork and exit, a page fault for each page a worker first reads.
    #[serde(default)]
    pub snapshot: bool,
    /// Give every object of the heap CPython's immortal reference count before the
    /// freeze (`immortal.rs`): a worker's reference counting then writes nothing to the
    /// zygote's pages, which stay shared instead of being copied.
    #[serde(default = "yes")]
    pub immortal: bool,
    /// Matplotlib's config and font cache; written by the zygote only.
    pub mpl_config_dir: PathBuf,
    pub limits: WorkerLimits,
    /// The isolation layers and the Python-level policy.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// The supervisor's pid: after PR_SET_PDEATHSIG the zygote checks its parent is still
    /// this process. Without it a parent of 1 is taken for "orphaned", which is wrong when
    /// the supervisor is PID 1 of its own PID namespace (a container).
    #[serde(default)]
    pub supervisor_pid: Option<i32>,
}

fn yes() -> bool {
    true
}

/// One piece of a child's warm-up: a small job (a `.py` file under `worker/python/`) run
/// through the runner like a request, its output thrown away.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum WarmUp {
    /// The runner's own path: compile, run, print, display the last expression.
    Python,
    /// Array arithmetic, reductions and a matrix product.
    Numpy,
    /// A DataFrame built, grouped, aggregated and displayed.
    Pandas,
    /// A figure drawn and rendered to PNG (matplotlib clears its font cache in every
    /// forked child: the first figure pays for loading the fonts again).
    Matplotlib,
    /// Top-level `await` over a few tasks: the event loop made, run and closed.
    Asyncio,
}

impl WarmUp {
    pub const ALL: [WarmUp; 5] = [
        WarmUp::Python,
        WarmUp::Numpy,
        WarmUp::Pandas,
        WarmUp::Matplotlib,
        WarmUp::Asyncio,
    ];

    /// The module whose presence this warm-up needs (`None`: the standard library).
    pub fn needs(self) -> Option<&'static str> {
        match self {
            WarmUp::Python => None,
            WarmUp::Numpy => Some("numpy"),
            WarmUp::Pandas => Some("pandas"),
            WarmUp::Matplotlib => Some("matplotlib.pyplot"),
            WarmUp::Asyncio => Some("asyncio"),
        }
    }
}

/// Resource limits every worker applies to itself before it says Ready.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerLimits {
    /// Added to the zygote's data segment to make RLIMIT_DATA.
    pub memory_limit_bytes: u64,
    /// RLIMIT_CPU of one job: a backstop behind the supervisor's wall-clock kill (SIGXCPU
    /// there, SIGKILL a second later).
    pub cpu_seconds: u64,
    /// Where the supervisor cannot move a session worker's RLIMIT_CPU for each run (it
    /// lacks CAP_SYS_RESOURCE) and enforces that budget itself: the CPU time of a session
    /// worker's whole life, the kernel's backstop behind the supervisor's. Every worker
    /// starts with it, and a stateless one lowers its limit to `cpu_seconds` itself as its
    /// job arrives, which takes no capability. `None`: workers start with `cpu_seconds`.
    #[serde(default)]
    pub cpu_life_seconds: Option<u64>,
    /// RLIMIT_FSIZE: the largest file a job may write.
    pub max_file_bytes: u64,
    /// RLIMIT_NOFILE.
    pub max_open_files: u64,
    /// RLIMIT_NPROC: processes and threads of the worker's uid. Each worker has a uid of
    /// its own, so this bounds one worker's threads; where workers keep the service's
    /// uid (not root) it counts every process of that uid. Only enforced once a worker
    /// is not root.
    pub max_processes: u64,
}
