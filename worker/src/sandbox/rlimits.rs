//! Resource limits. RLIMIT_DATA is the zygote's data segment (inherited by the child) plus
//! the job's memory budget, so a large allocation fails with MemoryError instead of the
//! machine swapping; the others bound CPU, file sizes, fds, processes and core dumps.

use std::io;

use nix::sys::resource::{Resource, setrlimit};
use snakecage_worker::protocol::WorkerLimits;

pub fn apply(limits: &WorkerLimits) -> io::Result<()> {
    let data = current_data_bytes()?.saturating_add(limits.memory_limit_bytes);
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

/// VmData of this process, in bytes: what RLIMIT_DATA counts.
///
/// Read into a buffer on the stack: a fresh worker allocating from the heap it shares with
/// the zygote would copy the allocator's pages it touches (about ten per worker with a
/// growing `String`).
fn current_data_bytes() -> io::Result<u64> {
    let mut buf = [0u8; STATUS_BUFFER];
    // VmData comes early in the file; a truncated tail does not matter.
    let status = String::from_utf8_lossy(super::read_into(&mut buf, "/proc/self/status")?);
    parse_vm_data(&status).ok_or_else(|| io::Error::other("no VmData line in /proc/self/status"))
}

/// Room for `/proc/self/status` (about 1.5 KiB on Linux 6).
const STATUS_BUFFER: usize = 8192;

fn parse_vm_data(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmData:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_data_is_read_in_bytes() {
        let status = "Name:\tx\nVmData:\t  123456 kB\nVmStk:\t 132 kB\n";
        assert_eq!(parse_vm_data(status), Some(123456 * 1024));
        assert_eq!(parse_vm_data("Name:\tx\n"), None);
    }
}
