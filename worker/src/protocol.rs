//! The messages that cross process boundaries, one enum per direction.
//!
//! supervisor → zygote: [`ControlRequest`] on the control socket (SOCK_SEQPACKET, file
//! descriptors in SCM_RIGHTS); zygote → supervisor: [`ControlReply`].
//! supervisor → worker: [`JobRequest`] on the job socket; worker → supervisor:
//! [`WorkerMessage`]. User output never travels here: it goes through the worker's fd 1 and 2.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

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
    /// its hello). The scan (importlib.metadata over the whole venv) costs ~0.1–0.2 s of
    /// start-up; the packages are the same for every tier, so only one tier does it.
    #[serde(default = "yes")]
    pub describe_packages: bool,
    /// Map the heap back from a memfd snapshot once it is built (`snapshot.rs`): cheaper
    /// fork and exit, a page fault for each page a worker first reads.
    #[serde(default)]
    pub snapshot: bool,
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
    /// Compile, run, print and display a small pure-Python job.
    Python,
    /// Array arithmetic, reductions and a matrix product.
    Numpy,
    /// A DataFrame built, grouped, aggregated and displayed.
    Pandas,
    /// A figure drawn and rendered to PNG (matplotlib clears its font cache in every
    /// forked child: the first figure pays for loading the fonts again).
    Matplotlib,
}

impl WarmUp {
    pub const ALL: [WarmUp; 4] = [
        WarmUp::Python,
        WarmUp::Numpy,
        WarmUp::Pandas,
        WarmUp::Matplotlib,
    ];

    /// The module whose presence this warm-up needs (`None`: the standard library).
    pub fn needs(self) -> Option<&'static str> {
        match self {
            WarmUp::Python => None,
            WarmUp::Numpy => Some("numpy"),
            WarmUp::Pandas => Some("pandas"),
            WarmUp::Matplotlib => Some("matplotlib.pyplot"),
        }
    }
}

/// How the zygote and its workers isolate user code (see SECURITY.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Workers drop to this uid when the zygote runs as root.
    pub uid: u32,
    /// ... and to this gid, with no supplementary groups.
    pub gid: u32,
    /// Layers switched off by configuration (benchmarking only; logged loudly).
    pub layers_off: Vec<Layer>,
    /// Third-party top-level packages user code may import, on top of the standard-library
    /// allowlist.
    pub allowed_packages: Vec<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            uid: 65534,
            gid: 65534,
            layers_off: Vec::new(),
            allowed_packages: [
                "numpy",
                "pandas",
                "scipy",
                "matplotlib",
                "mpl_toolkits",
                "PIL",
                "openpyxl",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

impl SandboxConfig {
    pub fn wants(&self, layer: Layer) -> bool {
        !self.layers_off.contains(&layer)
    }
}

/// One isolation layer, as configured, probed and reported.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// Zygote: an empty network namespace, inherited by every worker.
    NetworkNamespace,
    /// Zygote: a private mount namespace giving dropped workers a read-only view of a
    /// Python prefix that lives in a directory they could not traverse.
    MountNamespace,
    /// Worker: resource limits (CPU, DATA, FSIZE, NOFILE, NPROC, CORE=0).
    Rlimits,
    /// Worker: setgroups([]), setresgid, setresuid to the unprivileged ids.
    DropPrivileges,
    /// Worker: PR_SET_NO_NEW_PRIVS (and not dumpable).
    NoNewPrivs,
    /// Worker: Landlock filesystem, network and scope rules.
    Landlock,
    /// Worker: the seccomp-bpf policy in `worker/seccomp/`.
    Seccomp,
    /// Python: the audit hook policy (defence in depth).
    AuditHook,
    /// Python: the import allowlist (defence in depth).
    ImportGuard,
}

impl Layer {
    pub const ALL: [Layer; 9] = [
        Layer::NetworkNamespace,
        Layer::MountNamespace,
        Layer::Rlimits,
        Layer::DropPrivileges,
        Layer::NoNewPrivs,
        Layer::Landlock,
        Layer::Seccomp,
        Layer::AuditHook,
        Layer::ImportGuard,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Layer::NetworkNamespace => "network_namespace",
            Layer::MountNamespace => "mount_namespace",
            Layer::Rlimits => "rlimits",
            Layer::DropPrivileges => "drop_privileges",
            Layer::NoNewPrivs => "no_new_privs",
            Layer::Landlock => "landlock",
            Layer::Seccomp => "seccomp",
            Layer::AuditHook => "audit_hook",
            Layer::ImportGuard => "import_guard",
        }
    }
}

/// Whether a layer protects the workers.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LayerState {
    /// Set up and verified by the start-up probe; every worker applies it.
    Active,
    /// Switched off by configuration (`sandbox.layers_off`).
    Off,
    /// Could not be set up here (kernel, privileges); `detail` says why.
    Unavailable,
}

/// What the zygote found out about one layer at start-up.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LayerReport {
    pub layer: Layer,
    pub state: LayerState,
    pub detail: String,
}

/// Resource limits every worker applies to itself before it says Ready.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerLimits {
    /// Added to the zygote's data segment to make RLIMIT_DATA.
    pub memory_limit_bytes: u64,
    /// RLIMIT_CPU: a backstop behind the supervisor's wall-clock kill.
    pub cpu_seconds: u64,
    /// RLIMIT_FSIZE: the largest file a job may write.
    pub max_file_bytes: u64,
    /// RLIMIT_NOFILE.
    pub max_open_files: u64,
    /// RLIMIT_NPROC: processes and threads of the workers' uid, all workers together
    /// (only enforced once a worker has dropped root).
    pub max_processes: u64,
}

/// supervisor → zygote.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Fork one worker. Attached fds, in order: the worker's end of its job socket, the
    /// write ends of its stdout and stderr pipes, and its workspace directory.
    Fork { worker_id: u64 },
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

/// supervisor → worker.
///
/// A stateless worker takes one `Run` and exits. A worker whose first request is
/// `StartSession` keeps one `__main__` namespace and serves `Run`, `Reset` and `Inspect`
/// one at a time until its job socket closes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum JobRequest {
    Run(Job),
    /// Become a session worker (no reply).
    StartSession,
    /// Session only: forget every user global (reply: [`WorkerMessage::ResetDone`]).
    Reset,
    /// Session only: describe the user globals (reply: [`WorkerMessage::Variables`]).
    Inspect,
    /// The answer to the [`WorkerMessage::ToolCall`] the running job is blocked on.
    ToolResult(ToolResult),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Job {
    /// The source to run as `__main__.py`; empty when `entrypoint` is set.
    pub code: String,
    pub stdin: Option<String>,
    pub last_line_interactive: bool,
    /// A file in the workspace (relative path) to run as `__main__` instead of `code`,
    /// like `python <entrypoint> <args>`.
    #[serde(default)]
    pub entrypoint: Option<String>,
    /// `sys.argv[1:]` for an `entrypoint`.
    #[serde(default)]
    pub args: Vec<String>,
    /// The largest rich-output bundle (all its MIME entries together) the runner reports;
    /// a bigger one is replaced by a note. 0: the runner's default.
    #[serde(default)]
    pub max_bundle_bytes: u64,
    /// The tools `snakecage.tools` offers this job (Code Mode); empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<crate::toolspec::ToolSpec>,
}

/// worker → supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    /// Hardened, warmed up, waiting for its job.
    Ready,
    /// The job ran to an end the worker could report (any exit code).
    Result(JobResult),
    /// A session's globals were cleared.
    ResetDone,
    /// A session's user globals.
    Variables { variables: Vec<Variable> },
    /// The running job calls a host tool and blocks until [`JobRequest::ToolResult`].
    ToolCall(ToolCall),
}

/// One call of a host tool by user code (worker → supervisor). Hostile like every frame:
/// the supervisor checks the name, the size and the schema of the arguments again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    /// Chosen by the worker, echoed in the answer; unique within a job.
    pub id: u64,
    pub name: String,
    /// A JSON object, checked against the tool's schema.
    pub arguments: serde_json::Value,
}

/// The answer to one [`ToolCall`] (supervisor → worker).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolResult {
    pub id: u64,
    #[serde(flatten)]
    pub outcome: ToolOutcome,
}

/// What a tool call came to: the tool's JSON result, or an error the worker raises as
/// `ToolError` (or a subclass named by `kind`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolOutcome {
    Ok {
        result: serde_json::Value,
    },
    Error {
        kind: ToolErrorKind,
        message: String,
        #[serde(default)]
        data: serde_json::Value,
    },
}

impl ToolOutcome {
    pub fn error(kind: ToolErrorKind, message: impl Into<String>) -> Self {
        ToolOutcome::Error {
            kind,
            message: message.into(),
            data: serde_json::Value::Null,
        }
    }
}

/// Why a tool call failed; a closed set (it is a metrics label too).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    /// The tool ran and reported an error.
    Failed,
    /// No tool of that name is offered to this run.
    UnknownTool,
    /// The arguments do not match the tool's schema.
    InvalidArguments,
    /// A per-run limit: number of calls, argument or result size.
    Limit,
    /// No answer within the per-call timeout.
    Timeout,
    /// The run was interrupted or cancelled while the call was pending.
    Cancelled,
    /// The tool's provider could not be reached.
    Unavailable,
}

impl ToolErrorKind {
    pub const ALL: [ToolErrorKind; 7] = [
        ToolErrorKind::Failed,
        ToolErrorKind::UnknownTool,
        ToolErrorKind::InvalidArguments,
        ToolErrorKind::Limit,
        ToolErrorKind::Timeout,
        ToolErrorKind::Cancelled,
        ToolErrorKind::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorKind::Failed => "failed",
            ToolErrorKind::UnknownTool => "unknown_tool",
            ToolErrorKind::InvalidArguments => "invalid_arguments",
            ToolErrorKind::Limit => "limit",
            ToolErrorKind::Timeout => "timeout",
            ToolErrorKind::Cancelled => "cancelled",
            ToolErrorKind::Unavailable => "unavailable",
        }
    }
}

/// One rich output, like a Jupyter `display_data`: MIME type ⇒ content (text, or base64
/// for binary types such as `image/png`).
pub type MimeBundle = std::collections::BTreeMap<String, String>;

/// A session global as `GET /v1/sessions/{id}` lists it: bounded, never the value itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Variable {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// A short repr, cut to a fixed length.
    pub repr: String,
    /// For arrays and DataFrames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
}

/// What the runner reports about one job; output is not in here (it went to fd 1/2).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobResult {
    pub exit_code: i32,
    /// An uncaught `MemoryError`: the job hit its memory limit.
    pub memory_error: bool,
    pub error: Option<ErrorInfo>,
    /// Rich outputs in the order produced: `display()` calls, the last expression's value,
    /// then matplotlib figures left open.
    #[serde(default)]
    pub results: Vec<MimeBundle>,
}

/// The uncaught exception of a job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorInfo {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{MAX_FRAME_LEN, decode_exact, encode};

    #[test]
    fn messages_have_a_stable_tagged_wire_form() {
        let msg = WorkerMessage::Result(JobResult {
            exit_code: 1,
            memory_error: false,
            error: Some(ErrorInfo {
                kind: "ZeroDivisionError".into(),
                message: "division by zero".into(),
            }),
            results: Vec::new(),
        });
        let json = serde_json::to_value(&msg).unwrap();
        assert_eq!(json["type"], "result");
        assert_eq!(json["error"]["type"], "ZeroDivisionError");
        let reply = ControlReply::Exited {
            pid: 9,
            status: ExitStatus::Signal(9),
        };
        let back: ControlReply = decode_exact(&encode(&reply).unwrap(), MAX_FRAME_LEN).unwrap();
        assert!(matches!(
            back,
            ControlReply::Exited {
                pid: 9,
                status: ExitStatus::Signal(9)
            }
        ));
    }

    #[test]
    fn a_job_without_entrypoint_fields_still_decodes() {
        let job: Job =
            serde_json::from_str(r#"{"code":"1","stdin":null,"last_line_interactive":true}"#)
                .unwrap();
        assert_eq!((job.entrypoint, job.args.len()), (None, 0));
    }

    #[test]
    fn session_requests_and_replies_have_a_stable_wire_form() {
        let json = serde_json::to_value(JobRequest::StartSession).unwrap();
        assert_eq!(json, serde_json::json!({"type": "start_session"}));
        let msg: WorkerMessage = serde_json::from_str(
            r#"{"type":"variables","variables":[{"name":"x","type":"int","repr":"42"}]}"#,
        )
        .unwrap();
        let WorkerMessage::Variables { variables } = msg else {
            panic!("not variables")
        };
        assert_eq!(
            (variables[0].kind.as_str(), variables[0].shape.clone()),
            ("int", None)
        );
        // Results without rich outputs (an older worker) still decode.
        let r: JobResult =
            serde_json::from_str(r#"{"exit_code":0,"memory_error":false,"error":null}"#).unwrap();
        assert!(r.results.is_empty());
    }

    #[test]
    fn layers_have_snake_case_names_on_the_wire() {
        for layer in Layer::ALL {
            let json = serde_json::to_value(layer).unwrap();
            assert_eq!(json, layer.as_str());
            let back: Layer = serde_json::from_value(json).unwrap();
            assert_eq!(back, layer);
        }
        assert!(serde_json::from_str::<Layer>("\"firewall\"").is_err());
    }

    #[test]
    fn tool_calls_and_results_have_a_stable_wire_form() {
        let call: WorkerMessage = serde_json::from_str(
            r#"{"type":"tool_call","id":3,"name":"weather","arguments":{"city":"Zürich"}}"#,
        )
        .unwrap();
        let WorkerMessage::ToolCall(call) = call else {
            panic!("not a tool call")
        };
        assert_eq!((call.id, call.name.as_str()), (3, "weather"));
        let ok = JobRequest::ToolResult(ToolResult {
            id: 3,
            outcome: ToolOutcome::Ok {
                result: serde_json::json!({"t": 21}),
            },
        });
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            serde_json::json!({"type": "tool_result", "id": 3, "status": "ok", "result": {"t": 21}})
        );
        let err = ToolResult {
            id: 4,
            outcome: ToolOutcome::error(ToolErrorKind::Limit, "too many calls"),
        };
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(
            (json["status"].as_str(), json["kind"].as_str()),
            (Some("error"), Some("limit"))
        );
        let back: ToolResult = serde_json::from_value(json).unwrap();
        assert_eq!(back, err);
        for kind in ToolErrorKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }

    #[test]
    fn an_unknown_message_type_is_rejected() {
        let err = serde_json::from_str::<WorkerMessage>(r#"{"type":"root_shell"}"#);
        assert!(err.is_err());
    }
}
