//! The isolation layers: which are wanted (configuration), and what the zygote found out
//! about each at start-up.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How the zygote and its workers isolate user code (see SECURITY.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxConfig {
    /// When the zygote runs as root: the uid the start-up probe drops to, and a worker
    /// whose fork request names none drops to (each request of the supervisor names its
    /// worker's own).
    pub uid: u32,
    /// ... and to this gid, with no supplementary groups.
    pub gid: u32,
    /// Layers switched off by configuration (benchmarking only; logged loudly).
    pub layers_off: Vec<Layer>,
    /// Third-party top-level packages user code may import, on top of the standard-library
    /// allowlist.
    pub allowed_packages: Vec<String>,
    /// The instance's cgroup, set up by the supervisor, which every worker joins.
    #[serde(default)]
    pub cgroup: CgroupPlan,
}

/// What the supervisor made of the `cgroup` layer: the cgroup every worker joins as the
/// first step of its hardening, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CgroupPlan {
    /// Write `0` (the writer) to each of these files: a v1 cgroup's `tasks` (the worker's
    /// one thread), or v2's `cgroup.procs`; `detail` is the layer's report.
    Join { procs: Vec<PathBuf>, detail: String },
    /// No cgroup for the workers: why.
    Unavailable(String),
}

impl Default for CgroupPlan {
    fn default() -> Self {
        CgroupPlan::Unavailable("the supervisor set up no cgroup".into())
    }
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
            cgroup: CgroupPlan::default(),
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
    /// Supervisor and worker: a cgroup of the instance's own that every worker joins,
    /// bounding all of them together (`pids.max`).
    Cgroup,
}

impl Layer {
    pub const ALL: [Layer; 10] = [
        Layer::NetworkNamespace,
        Layer::MountNamespace,
        Layer::Rlimits,
        Layer::DropPrivileges,
        Layer::NoNewPrivs,
        Layer::Landlock,
        Layer::Seccomp,
        Layer::AuditHook,
        Layer::ImportGuard,
        Layer::Cgroup,
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
            Layer::Cgroup => "cgroup",
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
