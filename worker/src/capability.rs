//! Who may raise a process out of `SCHED_IDLE`, read in one place for the zygote (which
//! only lowers itself there when the supervisor can raise its workers back) and the
//! supervisor (which only starts a rollover's zygotes there when it can raise them).

/// Whether CAP_SYS_NICE is in this process's effective set.
pub fn has_cap_sys_nice() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0)
}

/// Whether this process may give another of its uid normal priority (`SCHED_OTHER`, nice
/// 0) again: CAP_SYS_NICE, or an `RLIMIT_NICE` that allows nice 0.
pub fn can_raise_priority() -> bool {
    has_cap_sys_nice()
        || nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NICE)
            .is_ok_and(|(soft, _)| soft >= 20)
}
