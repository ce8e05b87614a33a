//! Resource limits. RLIMIT_DATA is the zygote's data segment (inherited by the child) plus
//! the job's memory budget, so a large allocation fails with MemoryError instead of the
//! machine swapping; the others bound CPU, file sizes, fds, processes and core dumps.

use std::io;

use nix::sys::resource::{Resource, setrlimit};
use snakecage_worker::protocol::WorkerLimits;

/// `data_bytes`: this process's data size (`VmData`) as the limits apply, which the job's
/// memory budget goes on top of.
pub fn apply(limits: &WorkerLimits, data_bytes: u64) -> io::Result<()> {
    let data = data_bytes.saturating_add(limits.memory_limit_bytes);
    set(Resource::RLIMIT_DATA, data, data)?;
    // SIGXCPU at the soft limit, SIGKILL one second later: one job's CPU time, or a
    // session worker's life's until a job arrives (`for_one_job`).
    let cpu = limits.cpu_life_seconds.unwrap_or(limits.cpu_seconds);
    set(Resource::RLIMIT_CPU, cpu, cpu + 1)?;
    set(
        Resource::RLIMIT_FSIZE,
        limits.max_file_bytes,
        limits.max_file_bytes,
    )?;
    set(
        Resource::RLIMIT_NOFILE,
        limits.max_open_files,
        limits.max_open_files,
    )?;
    // Counted per uid: each worker has one of its own, so this bounds its own processes
    // and threads (where workers keep the service's uid, not root, every process of that
    // uid counts). Enforced once a worker is not root. It stops thread bombs; the DATA
    // limit bounds their stacks too.
    set(
        Resource::RLIMIT_NPROC,
        limits.max_processes,
        limits.max_processes,
    )?;
    set(Resource::RLIMIT_CORE, 0, 0)?;
    Ok(())
}

/// Before a stateless worker's job runs: RLIMIT_CPU down from a session worker's life's to
/// one job's (counted from the fork, as it was set), where workers start with the former.
/// Lowering a limit takes no capability, and nothing in the worker can raise the hard
/// limit again. One `prlimit64` on the job's path (about a microsecond), only where it
/// moves the limit.
pub fn for_one_job(limits: &WorkerLimits) -> io::Result<()> {
    if limits.cpu_life_seconds.is_none() {
        return Ok(());
    }
    set(
        Resource::RLIMIT_CPU,
        limits.cpu_seconds,
        limits.cpu_seconds + 1,
    )
}

fn set(resource: Resource, soft: u64, hard: u64) -> io::Result<()> {
    setrlimit(resource, soft, hard).map_err(|e| io::Error::other(format!("{resource:?}: {e}")))
}
