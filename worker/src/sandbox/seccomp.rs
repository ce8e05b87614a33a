//! seccomp-bpf: the syscall policy is data (`worker/seccomp/worker.json`, one justification
//! per rule), compiled once in the zygote and installed by each worker as its last OS step.
//!
//! The policy is a short deny list (EPERM, so Python raises a clear PermissionError) rather
//! than an allow list: CPython and numpy need a few hundred syscalls, and a small filter is
//! fast to install and to run. Landlock, the dropped uid and the namespaces stop what the
//! deny list lets through; SECURITY.md discusses the trade-off.

use seccompiler::{BpfProgram, TargetArch};

const POLICY: &str = include_str!("../../seccomp/worker.json");

/// The compiled filters, in installation order.
pub struct Filters(Vec<BpfProgram>);

/// Filter names in the policy file, in the order they are installed.
const FILTERS: [&str; 2] = ["worker", "worker_enosys"];

impl Filters {
    pub fn compile() -> Result<Self, String> {
        Self::compile_policy(POLICY)
    }

    fn compile_policy(policy: &str) -> Result<Self, String> {
        let arch = TargetArch::try_from(std::env::consts::ARCH)
            .map_err(|e| format!("seccomp on {}: {e}", std::env::consts::ARCH))?;
        let mut map = seccompiler::compile_from_json(policy.as_bytes(), arch)
            .map_err(|e| format!("worker/seccomp/worker.json: {e}"))?;
        let filters = FILTERS
            .iter()
            .map(|name| {
                map.remove(*name)
                    .ok_or_else(|| format!("worker/seccomp/worker.json has no {name:?} filter"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self(filters))
    }

    /// BPF instructions over all filters (what each worker installs).
    pub fn instructions(&self) -> usize {
        self.0.iter().map(Vec::len).sum()
    }

    /// Installs every filter on the calling thread (the worker has only one).
    pub fn install(&self) -> std::io::Result<()> {
        for filter in &self.0 {
            seccompiler::apply_filter(filter).map_err(std::io::Error::other)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Rule {
        syscall: String,
        comment: Option<String>,
    }

    #[derive(serde::Deserialize)]
    struct Filter {
        filter: Vec<Rule>,
    }

    #[test]
    fn the_policy_compiles_and_stays_small() {
        let filters = Filters::compile().unwrap();
        assert!(filters.instructions() < 400, "{}", filters.instructions());
    }

    #[test]
    fn every_rule_is_justified_and_the_essentials_are_denied() {
        let policy: std::collections::HashMap<String, Filter> =
            serde_json::from_str(POLICY).unwrap();
        let mut denied = Vec::new();
        for filter in policy.values() {
            for rule in &filter.filter {
                let comment = rule.comment.as_deref().unwrap_or_default();
                assert!(comment.len() > 5, "{} has no justification", rule.syscall);
                denied.push(rule.syscall.as_str());
            }
        }
        for essential in [
            "execve",
            "execveat",
            "fork",
            "vfork",
            "clone",
            "clone3",
            "ptrace",
            "mount",
            "unshare",
            "setns",
            "bpf",
            "io_uring_setup",
            "keyctl",
            "socket",
            "perf_event_open",
            "kexec_load",
        ] {
            assert!(denied.contains(&essential), "{essential} is not denied");
        }
    }

    #[test]
    fn a_policy_without_the_expected_filters_is_rejected() {
        let err = Filters::compile_policy(r#"{"other": {"mismatch_action": "allow", "match_action": {"errno": 1}, "filter": []}}"#)
            .err()
            .unwrap();
        assert!(err.contains("no \"worker\" filter"), "{err}");
        assert!(Filters::compile_policy("{").is_err());
    }
}
