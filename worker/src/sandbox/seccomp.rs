//! seccomp-bpf: the syscall policy is data, one justification per rule, compiled once in
//! the zygote and installed in two parts:
//!
//! - `worker/seccomp/zygote.json`, the bulk, is installed by the zygote itself once it has
//!   preloaded and before it forks its first worker; every worker inherits it for free (no
//!   per-worker copy, JIT or action-cache preparation of ~300 BPF instructions). It denies
//!   nothing the zygote does after that point: it only polls, forks, reaps and replies.
//! - `worker/seccomp/worker.json` holds what the zygote needs and a worker must not have:
//!   process creation (`fork`, `vfork`, `clone` without `CLONE_THREAD`). Each worker
//!   installs it as its last OS step; it is a few instructions.
//!
//! The policy is a deny list (EPERM, so Python raises a clear PermissionError) rather than
//! an allow list: CPython and numpy need a few hundred syscalls. Its evaluation cost per
//! syscall does not depend on its length for the allowed ones: since Linux 5.11 the kernel
//! caches, per filter, the syscalls a filter allows whatever their arguments and skips the
//! BPF program for them. Landlock, the dropped uid and the namespaces stop what the deny
//! list lets through; SECURITY.md discusses the trade-off.

use seccompiler::{BpfProgram, TargetArch};

const ZYGOTE_POLICY: &str = include_str!("../../seccomp/zygote.json");
const WORKER_POLICY: &str = include_str!("../../seccomp/worker.json");

/// Filter names in `zygote.json`, in installation order.
const ZYGOTE_FILTERS: [&str; 2] = ["zygote", "zygote_enosys"];
/// Filter names in `worker.json`, in installation order.
const WORKER_FILTERS: [&str; 1] = ["worker"];

/// The compiled filters of both parts.
pub struct Filters {
    zygote: Vec<BpfProgram>,
    worker: Vec<BpfProgram>,
}

impl Filters {
    pub fn compile() -> Result<Self, String> {
        Ok(Self {
            zygote: compile_policy("zygote.json", ZYGOTE_POLICY, &ZYGOTE_FILTERS)?,
            worker: compile_policy("worker.json", WORKER_POLICY, &WORKER_FILTERS)?,
        })
    }

    /// BPF instructions of the part the zygote installs once.
    pub fn zygote_instructions(&self) -> usize {
        self.zygote.iter().map(Vec::len).sum()
    }

    /// BPF instructions of the part each worker installs.
    pub fn worker_instructions(&self) -> usize {
        self.worker.iter().map(Vec::len).sum()
    }

    /// Installs the zygote's part on the calling thread (the zygote has only one); every
    /// process it forks afterwards inherits it. Sets no_new_privs first, as seccomp
    /// requires without CAP_SYS_ADMIN (the zygote never executes a program).
    pub fn install_zygote_part(&self) -> std::io::Result<()> {
        install(&self.zygote)
    }

    /// Installs the per-worker part on the calling thread (the worker has only one).
    pub fn install_worker_part(&self) -> std::io::Result<()> {
        install(&self.worker)
    }
}

fn install(filters: &[BpfProgram]) -> std::io::Result<()> {
    for filter in filters {
        seccompiler::apply_filter(filter).map_err(std::io::Error::other)?;
    }
    Ok(())
}

fn compile_policy(file: &str, policy: &str, names: &[&str]) -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("seccomp on {}: {e}", std::env::consts::ARCH))?;
    let mut map = seccompiler::compile_from_json(policy.as_bytes(), arch)
        .map_err(|e| format!("worker/seccomp/{file}: {e}"))?;
    names
        .iter()
        .map(|name| {
            map.remove(*name)
                .ok_or_else(|| format!("worker/seccomp/{file} has no {name:?} filter"))
        })
        .collect()
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

    fn rules(policy: &str) -> Vec<(String, String)> {
        let policy: std::collections::HashMap<String, Filter> =
            serde_json::from_str(policy).unwrap();
        policy
            .into_values()
            .flat_map(|f| f.filter)
            .map(|r| (r.syscall, r.comment.unwrap_or_default()))
            .collect()
    }

    #[test]
    fn the_policy_compiles_and_the_per_worker_part_is_tiny() {
        let filters = Filters::compile().unwrap();
        assert!(
            filters.zygote_instructions() < 400,
            "{}",
            filters.zygote_instructions()
        );
        assert!(
            filters.worker_instructions() < 32,
            "{}",
            filters.worker_instructions()
        );
    }

    #[test]
    fn every_rule_is_justified_and_the_essentials_are_denied() {
        let mut denied = Vec::new();
        for (syscall, comment) in rules(ZYGOTE_POLICY).into_iter().chain(rules(WORKER_POLICY)) {
            assert!(comment.len() > 5, "{syscall} has no justification");
            denied.push(syscall);
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
            assert!(
                denied.iter().any(|d| d == essential),
                "{essential} is not denied"
            );
        }
    }

    /// The zygote forks after installing its part; only the worker's part may deny that.
    #[test]
    fn the_zygote_part_leaves_fork_to_the_worker_part() {
        let zygote: Vec<String> = rules(ZYGOTE_POLICY).into_iter().map(|r| r.0).collect();
        for needed in ["fork", "vfork", "clone"] {
            assert!(
                !zygote.iter().any(|s| s == needed),
                "zygote.json denies {needed}"
            );
        }
    }

    /// In a child process: with the zygote's part installed it can still fork (as the
    /// zygote must), and once the worker's part is on top, fork fails with EPERM.
    #[test]
    fn a_process_with_the_zygote_part_forks_and_one_with_both_parts_cannot() {
        let filters = Filters::compile().unwrap();
        // SAFETY: the child only makes raw syscalls (seccomp, fork, waitpid, _exit) and
        // allocates nothing, so the test harness's other threads cannot leave it a lock.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = (|| {
                if filters.install_zygote_part().is_err() {
                    return 10;
                }
                // SAFETY: as above; the grandchild exits at once.
                let grandchild = unsafe { libc::fork() };
                if grandchild == 0 {
                    // SAFETY: ends the grandchild at once.
                    unsafe { libc::_exit(0) };
                }
                if grandchild < 0 {
                    return 11; // the zygote's part denied the zygote's own fork
                }
                // SAFETY: reaps the grandchild we just forked.
                unsafe { libc::waitpid(grandchild, std::ptr::null_mut(), 0) };
                if filters.install_worker_part().is_err() {
                    return 12;
                }
                // SAFETY: as above.
                let denied = unsafe { libc::fork() };
                if denied == 0 {
                    // SAFETY: ends the grandchild at once.
                    unsafe { libc::_exit(0) };
                }
                let errno = std::io::Error::last_os_error().raw_os_error();
                if denied < 0 && errno == Some(libc::EPERM) {
                    0
                } else {
                    13
                }
            })();
            // SAFETY: ends the test child without running the harness's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: reaps the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "{status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "10 install, 11 zygote could not fork, 12 install, 13 worker could fork"
        );
    }

    /// The kernel's `seccomp_is_const_allow` (kernel/seccomp.c, Linux 5.11+): whether a
    /// filter allows syscall `nr` on the native architecture whatever the arguments, in
    /// which case the kernel caches that and never runs the filter for `nr`.
    fn kernel_would_cache_allow(filter: &[seccompiler::sock_filter], nr: u32) -> bool {
        const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
        let (mut acc, mut pc) = (0u32, 0usize);
        while let Some(insn) = filter.get(pc) {
            let k = insn.k;
            match insn.code {
                0x20 => match k {
                    0 => acc = nr,                // BPF_LD|BPF_W|BPF_ABS of seccomp_data.nr
                    4 => acc = AUDIT_ARCH_X86_64, // .arch
                    _ => return false,            // an argument: not constant
                },
                0x06 => return k == 0x7fff_0000, // BPF_RET|BPF_K: SECCOMP_RET_ALLOW?
                0x05 => pc += k as usize,        // BPF_JMP|BPF_JA
                0x15 | 0x35 | 0x25 | 0x45 => {
                    let taken = match insn.code {
                        0x15 => acc == k,  // JEQ
                        0x35 => acc >= k,  // JGE
                        0x25 => acc > k,   // JGT
                        _ => acc & k != 0, // JSET
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                0x54 => acc &= k, // BPF_ALU|BPF_AND|BPF_K
                _ => return false,
            }
            pc += 1;
        }
        false
    }

    /// Why an allow list compiled to a binary search would not make allowed syscalls any
    /// cheaper: for every syscall the policy does not name, the kernel can prove the
    /// filters allow it and skips them entirely.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_syscall_the_policy_does_not_name_skips_the_filters() {
        let filters = Filters::compile().unwrap();
        for (policy, programs) in [
            (ZYGOTE_POLICY, &filters.zygote),
            (WORKER_POLICY, &filters.worker),
        ] {
            let named: std::collections::HashSet<String> =
                rules(policy).into_iter().map(|r| r.0).collect();
            let evaluated = (0..512)
                .filter(|&nr| !programs.iter().all(|f| kernel_would_cache_allow(f, nr)))
                .count();
            assert_eq!(evaluated, named.len(), "{named:?}");
        }
    }

    #[test]
    fn a_policy_without_the_expected_filters_is_rejected() {
        let other = r#"{"other": {"mismatch_action": "allow", "match_action": {"errno": 1}, "filter": []}}"#;
        let err = compile_policy("x.json", other, &ZYGOTE_FILTERS)
            .err()
            .unwrap();
        assert!(err.contains("no \"zygote\" filter"), "{err}");
        assert!(compile_policy("x.json", "{", &WORKER_FILTERS).is_err());
    }
}
