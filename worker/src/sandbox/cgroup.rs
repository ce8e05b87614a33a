//! Joining the instance's cgroup: the supervisor made it (and bounds it: `pids.max`), each
//! worker moves itself in as the first step of its hardening, while it is still the
//! zygote's uid and before Landlock would hide `/sys`. The zygotes stay outside it, so a
//! cgroup full of one tenant's threads never stops a fork: the new worker joins (moving a
//! process in is not refused at the bound) and can start no thread of its own until some
//! are gone.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// The files a worker writes to join the cgroup, opened once, in the zygote, before its
/// first fork: every worker writes through the descriptors it inherits instead of walking
/// the paths (a v1 `tasks` file is 6–7 components down `/sys/fs/cgroup`). A file the zygote
/// could not open is opened by each worker, which then fails naming it, as it did before.
#[derive(Default)]
pub struct JoinFiles {
    files: Vec<(PathBuf, Option<OwnedFd>)>,
}

impl JoinFiles {
    pub fn open(procs: &[impl AsRef<Path>]) -> Self {
        let files = procs
            .iter()
            .map(|file| {
                let file = file.as_ref();
                let fd = open_for_writing(file)
                    .ok()
                    .and_then(|fd| super::fds::above_fixed(fd).ok());
                (file.to_path_buf(), fd)
            })
            .collect();
        Self { files }
    }

    /// The descriptors a worker keeps until its layers are on.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.files
            .iter()
            .filter_map(|(_, fd)| fd.as_ref().map(AsRawFd::as_raw_fd))
    }
}

fn open_for_writing(file: &Path) -> io::Result<OwnedFd> {
    Ok(std::fs::OpenOptions::new().write(true).open(file)?.into())
}

/// Moves this process into the cgroup of each file: a v1 cgroup's `tasks` (this process
/// has one thread here: the supervisor chose the file, see `JOIN_V1` in
/// `src/pool/cgroup/mod.rs`) or v2's `cgroup.procs`; `0` names the writer itself (the
/// process that writes, not the one that opened the file). At the worker's background
/// priority: raising it for the step cost every request 0.2–0.4 ms of paced p50
/// (BENCHMARKS.md), and a worker that waits on the kernel's `cgroup_mutex` behind a
/// starved one is waited for as starved (`src/pool/starved.rs`).
pub fn join(files: &JoinFiles) -> io::Result<()> {
    // `tasks` moves only the writer's thread: any other would stay outside the bound.
    // Counted once for all of them (a `/proc` read per file would cost every worker a
    // path walk for nothing: nothing here starts a thread).
    let tasks = files
        .files
        .iter()
        .map(|(file, _)| file)
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
    for (file, fd) in &files.files {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", file.display()));
        let opened;
        let fd = match fd {
            Some(fd) => fd,
            None => {
                opened = open_for_writing(file).map_err(named)?;
                &opened
            }
        };
        // At offset 0: the zygote's descriptor is shared by all its workers.
        match nix::sys::uio::pwrite(fd, b"0", 0) {
            Ok(1) => {}
            Ok(_) => return Err(named(io::Error::other("a short write"))),
            Err(e) => return Err(named(e.into())),
        }
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
        let e = join(&JoinFiles::open(&[&tasks])).unwrap_err();
        let said = format!(
            "{}: moves only the thread that writes it, and this process has ",
            tasks.display()
        );
        assert!(e.to_string().starts_with(&said), "{e}");
        assert_eq!(std::fs::read_to_string(&tasks).unwrap(), "");
        let procs = dir.path().join("cgroup.procs");
        std::fs::write(&procs, "").unwrap();
        join(&JoinFiles::open(&[&procs])).unwrap();
        assert_eq!(std::fs::read_to_string(&procs).unwrap(), "0");
        // Through the descriptor opened once, as a worker writes: at offset 0 each time.
        let once = JoinFiles::open(&[&procs]);
        assert_eq!(once.fds().count(), 1);
        join(&once).unwrap();
        join(&once).unwrap();
        assert_eq!(std::fs::read_to_string(&procs).unwrap(), "0");
        // A file that could not be opened once is opened at the join, and named there.
        let missing = dir.path().join("gone");
        let late = JoinFiles::open(&[&missing]);
        assert_eq!(late.fds().count(), 0);
        let e = join(&late).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("{}: ", missing.display())),
            "{e}"
        );
    }
}
