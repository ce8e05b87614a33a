//! Joining the instance's cgroup: the supervisor made it (and bounds it: `pids.max`), each
//! worker moves itself in as the first step of its hardening, while it is still the
//! zygote's uid and before Landlock would hide `/sys`. The zygotes stay outside it, so a
//! cgroup full of one tenant's threads never stops a fork: the new worker joins (moving a
//! process in is not refused at the bound) and can start no thread of its own until some
//! are gone.

use std::io::{self, Write};
use std::path::Path;

/// Moves this process into the cgroup of each file: a v1 cgroup's `tasks` (this process
/// has one thread here: the supervisor chose the file, see `JOIN_V1` in
/// `src/pool/cgroup/mod.rs`) or v2's `cgroup.procs`; `0` names the writer itself. At the
/// worker's background priority: raising it for the step cost every request 0.2–0.4 ms of
/// paced p50 (BENCHMARKS.md), and a worker that waits on the kernel's `cgroup_mutex`
/// behind a starved one is waited for as starved (`src/pool/starved.rs`).
pub fn join(procs: &[impl AsRef<Path>]) -> io::Result<()> {
    // `tasks` moves only the writer's thread: any other would stay outside the bound.
    // Counted once for all of them (a `/proc` read per file would cost every worker a
    // path walk for nothing: nothing here starts a thread).
    let tasks = procs
        .iter()
        .map(AsRef::as_ref)
        .find(|file| file.file_name() == Some("tasks".as_ref()));
    if let Some(file) = tasks {
        let threads = super::thread_count()?;
        if threads != 1 {
            return Err(io::Error::other(format!(
                "{}: moves only the thread that writes it, and this process has {threads}",
                file.display()
            )));
        }
    }
    for file in procs {
        let file = file.as_ref();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        f.write_all(b"0")
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test runs on a thread of the harness's: this process has several, and `tasks`
    /// would leave all but one outside the cgroup, so the join refuses it; `cgroup.procs`
    /// (which moves them all) is written.
    #[test]
    fn tasks_is_written_only_by_a_process_of_one_thread() {
        assert!(crate::sandbox::thread_count().unwrap() > 1);
        let dir = tempfile::tempdir().unwrap();
        let tasks = dir.path().join("tasks");
        std::fs::write(&tasks, "").unwrap();
        let e = join(&[&tasks]).unwrap_err();
        let said = format!(
            "{}: moves only the thread that writes it, and this process has ",
            tasks.display()
        );
        assert!(e.to_string().starts_with(&said), "{e}");
        assert_eq!(std::fs::read_to_string(&tasks).unwrap(), "");
        let procs = dir.path().join("cgroup.procs");
        std::fs::write(&procs, "").unwrap();
        join(&[&procs]).unwrap();
        assert_eq!(std::fs::read_to_string(&procs).unwrap(), "0");
    }
}
