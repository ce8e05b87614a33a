//! Which capabilities this process holds, read in one place: who may raise a process out
//! of `SCHED_IDLE` (the zygote only lowers itself there when the supervisor can raise its
//! workers back; the supervisor only starts a rollover's zygotes there when it can raise
//! them), and whether the supervisor may raise a session worker's CPU-time limit.

/// Bit numbers in the capability sets (`linux/capability.h`).
const CAP_SYS_RESOURCE: u32 = 24;
const CAP_SYS_NICE: u32 = 23;

/// Whether capability `bit` is in this process's effective set.
fn has_capability(bit: u32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// Whether CAP_SYS_NICE is in this process's effective set.
pub fn has_cap_sys_nice() -> bool {
    has_capability(CAP_SYS_NICE)
}

/// Whether this process may raise a hard resource limit (its own or, with `prlimit`,
/// another's): CAP_SYS_RESOURCE in the host's initial user namespace, which the kernel
/// checks for this whatever namespace the target is in. A container that drops the
/// capability, or runs in a user namespace of its own, may not.
pub fn can_raise_hard_limits() -> bool {
    has_capability(CAP_SYS_RESOURCE) && in_initial_user_namespace()
}

/// The initial user namespace maps every uid to itself; any other maps a range.
fn in_initial_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|map| map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// Whether this process may give another of its uid normal priority (`SCHED_OTHER`, nice
/// 0) again: CAP_SYS_NICE, or an `RLIMIT_NICE` that allows nice 0.
pub fn can_raise_priority() -> bool {
    has_cap_sys_nice()
        || nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NICE)
            .is_ok_and(|(soft, _)| soft >= 20)
}
