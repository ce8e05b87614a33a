//! CPU priority of background work: the zygote, its forks, every worker until it is given
//! a job. With CAP_SYS_NICE the zygote runs at `SCHED_IDLE`, which on this kernel yields
//! to a woken request at once (a niced task finishes its slice first); the supervisor,
//! holding the same capability, raises a worker to `SCHED_OTHER` before sending its job
//! and drops it back to `SCHED_IDLE` before killing it, so its exit teardown runs idle too.
//!
//! Without CAP_SYS_NICE nobody could raise a worker out of `SCHED_IDLE` (an unprivileged
//! switch back to `SCHED_OTHER` needs `RLIMIT_NICE` ≥ 20, and after the uid drop the worker
//! could not do it itself), so the zygote only lowers its niceness then, as far as a job
//! may still run at without hurting: nice 10.

use std::io;

use snakecage_worker::capability::has_cap_sys_nice;

/// Niceness of the zygote when it cannot use `SCHED_IDLE`.
const FALLBACK_NICE: i32 = 10;

/// Lowers this process (and so every child it forks) to background priority. Failure only
/// costs latency, so it is logged, not fatal.
pub fn lower_to_background() {
    // The supervisor that exec'd the zygote has the same capabilities.
    if has_cap_sys_nice() {
        match set_idle() {
            Ok(()) => {
                // The start-up niceness is over (it means nothing under SCHED_IDLE, but
                // it would stay with every worker forked from here).
                let _ = set_own_nice(0);
                return;
            }
            Err(e) => eprintln!("snakecage-worker: cannot switch to SCHED_IDLE: {e}"),
        }
    }
    if let Err(e) = set_own_nice(FALLBACK_NICE) {
        eprintln!("snakecage-worker: cannot lower the zygote's priority: {e}");
    }
}

/// The niceness the zygote prepares at ([`ZygoteConfig::startup_nice`]). A zygote the
/// supervisor started at `SCHED_IDLE` (a rollover's, background work until the supervisor
/// raises it) keeps that. Failure only costs start-up time, so it is logged, not fatal.
///
/// [`ZygoteConfig::startup_nice`]: snakecage_worker::protocol::ZygoteConfig::startup_nice
pub fn set_startup_nice(nice: i32) {
    if nice == 0 || policy() == libc::SCHED_IDLE {
        return;
    }
    if let Err(e) = set_own_nice(nice) {
        eprintln!("snakecage-worker: cannot set the start-up niceness {nice}: {e}");
    }
}

/// Sets this process's niceness.
fn set_own_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority on our own process (who = 0) with a plain integer.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves this process to `SCHED_IDLE`. Any process may lower itself; a worker does it
/// right before it exits, so the teardown of its address space never competes with a
/// request, whether or not the supervisor has got to it yet.
pub fn set_idle() -> io::Result<()> {
    set_policy(libc::SCHED_IDLE)
}

/// This process's scheduling policy.
fn policy() -> libc::c_int {
    // SAFETY: sched_getscheduler of this process; it returns the policy or -1.
    unsafe { libc::sched_getscheduler(0) }
}

/// Moves this process to `policy` (one without a static priority) at its niceness.
fn set_policy(policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on ourselves (pid 0) with a valid sched_param we own.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
