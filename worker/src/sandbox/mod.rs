//! The isolation steps, one mechanism per file. `child.rs` runs them in order; the zygote
//! runs the once-only ones at start-up.
//!
//! - [`namespaces`]: the zygote's empty network namespace and private mount namespace.
//! - [`cgroup`]: each worker joining the instance's cgroup.
//! - [`fds`], [`rlimits`]: each worker's descriptors and resource limits.
//! - [`privileges`]: the uid/gid drop, no_new_privs.
//! - [`landlock`]: filesystem, network and scope rules.
//! - [`seccomp`]: the syscall policy from `worker/seccomp/`: its bulk installed once in the
//!   zygote and inherited, a small part per worker.
//! - [`layers`]: which layers are active here (probed once at start-up) and how a worker
//!   applies them.

pub mod cgroup;
pub mod fds;
pub mod landlock;
pub mod layers;
pub mod namespaces;
pub mod privileges;
pub mod rlimits;
pub mod seccomp;

use std::io;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use snakecage_worker::protocol::ZygoteConfig;

/// Asks the kernel to SIGKILL this process when its parent dies, then checks the parent
/// did not die before the request took effect. With `expected_parent`, a different parent
/// (we were re-parented already) is an error too.
pub fn die_with_parent(expected_parent: Option<Pid>) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    let parent = nix::unistd::getppid();
    let orphaned = match expected_parent {
        Some(expected) => parent != expected,
        None => parent.as_raw() == 1,
    };
    if orphaned {
        return Err(io::Error::other(
            "parent exited before PR_SET_PDEATHSIG took effect",
        ));
    }
    Ok(())
}

/// The highest `oom_score_adj`: this process is the first the kernel's out-of-memory
/// killer ends, wherever memory runs out (among such processes, the largest). Any process
/// may raise its own. Written without the heap (nix opens a short path from the stack), so
/// that it copies none of the zygote's allocator pages.
pub fn oom_first() -> io::Result<()> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode;
    let fd = open(
        "/proc/self/oom_score_adj",
        OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let written = nix::unistd::write(&fd, b"1000")?;
    if written != 4 {
        return Err(io::Error::other(
            "a short write to /proc/self/oom_score_adj",
        ));
    }
    Ok(())
}

/// Points fd 0 at /dev/null, so no process below the zygote can read the supervisor's stdin.
pub fn stdin_from_dev_null() -> io::Result<()> {
    let null = std::fs::File::open("/dev/null")?;
    nix::unistd::dup2_stdin(null)?;
    Ok(())
}

/// Replaces the inherited environment with a fixed, small one before CPython starts, so
/// nothing of the supervisor's environment (credentials, tokens) reaches user code, and
/// numeric libraries stay single-threaded (threads would make fork unsafe).
pub fn fixed_environment(config: &ZygoteConfig) {
    let vars: Vec<(String, std::ffi::OsString)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("OPENBLAS_NUM_THREADS".into(), "1".into()),
        ("OMP_NUM_THREADS".into(), "1".into()),
        ("MKL_NUM_THREADS".into(), "1".into()),
        // pandas imports pyarrow when it is installed. Its bundled jemalloc starts a
        // purging thread as the library loads: the zygote of every tier that preloads
        // pandas would have two threads and refuse to fork.
        (
            "JE_ARROW_MALLOC_CONF".into(),
            "background_thread:false".into(),
        ),
        // Arrow's default allocator (mimalloc) reserves a 1 GiB arena on its first
        // allocation: in a zygote that reservation would count as its baseline, which
        // the workers' RLIMIT_DATA budget is added to (a worker could then fill it on top
        // of its budget); in a worker it exceeds the budget at once. The system allocator
        // maps what is used, so Arrow's memory counts against the limit like Python's.
        ("ARROW_DEFAULT_MEMORY_POOL".into(), "system".into()),
        // numpy sets these two while it imports unless they are set (through os.environ,
        // i.e. putenv, which the audit hook denies in a worker): set here, a worker of a
        // tier that did not preload numpy can still import it.
        ("OPENBLAS_MAIN_FREE".into(), "1".into()),
        ("GOTOBLAS_MAIN_FREE".into(), "1".into()),
        ("MPLBACKEND".into(), "Agg".into()),
        (
            "MPLCONFIGDIR".into(),
            config.mpl_config_dir.clone().into_os_string(),
        ),
    ];
    for (key, _) in std::env::vars_os() {
        // SAFETY: called before CPython starts, while the zygote has a single thread, so no
        // other thread can be reading the environment.
        unsafe { std::env::remove_var(key) };
    }
    for (key, value) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(key, value) };
    }
}

/// This process's `/proc/self/status`, opened once by the zygote and read again through the
/// same descriptor before every fork: a `pread` at offset 0 makes the kernel write the text
/// anew, so a fork costs no path walk under `/proc`. It tells the two things a fork needs
/// to know ([`AtFork`]). The descriptor names the zygote, so a worker closes it with the
/// rest of what it inherits (`fds::arrange`) and reads nothing of its own in its place.
pub struct OwnStatus(std::fs::File);

/// What the zygote knew of itself just before a fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtFork {
    /// `VmData` in bytes, which the child inherits: the baseline its `RLIMIT_DATA` budget
    /// is added to (`rlimits::apply`).
    pub data_bytes: u64,
}

impl OwnStatus {
    pub fn open() -> io::Result<Self> {
        Ok(Self(std::fs::File::open("/proc/self/status")?))
    }

    /// The zygote's checks at its start (after the preloads, before a snapshot): that it
    /// still has one thread, as [`Self::before_fork`] requires.
    pub fn one_thread(&self) -> io::Result<()> {
        self.before_fork().map(drop)
    }

    /// Refuses a fork unless this process has one thread (a second could hold a lock,
    /// malloc's or the GIL's, that the child would inherit locked forever); otherwise
    /// returns what the child inherits. Read into a stack buffer: whatever the zygote
    /// writes after a fork is copied on write, since its last child shares those pages.
    pub fn before_fork(&self) -> io::Result<AtFork> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; STATUS_BUFFER];
        let mut len = 0;
        while len < buf.len() {
            match self.0.read_at(&mut buf[len..], len as u64)? {
                0 => break,
                n => len += n,
            }
        }
        let status = parse_status(&buf[..len])
            .ok_or_else(|| io::Error::other("no Threads or VmData line in /proc/self/status"))?;
        if status.threads != 1 {
            return Err(io::Error::other(format!(
                "the zygote has {} threads, expected 1",
                status.threads
            )));
        }
        Ok(AtFork {
            data_bytes: status.data_bytes,
        })
    }
}

/// Room for `/proc/self/status` (about 1.5 KiB on Linux 6; `Threads` and `VmData` come
/// early, so a truncated tail does not matter).
const STATUS_BUFFER: usize = 4096;

#[derive(Debug, PartialEq, Eq)]
struct Status {
    threads: usize,
    data_bytes: u64,
}

/// `Threads` and `VmData` (in bytes) from the text of `/proc/PID/status`.
fn parse_status(text: &[u8]) -> Option<Status> {
    let (mut threads, mut data_bytes) = (None, None);
    for line in text.split(|&b| b == b'\n') {
        let value = |key: &[u8]| {
            let rest = line.strip_prefix(key)?;
            let field = rest
                .split(u8::is_ascii_whitespace)
                .find(|f| !f.is_empty())?;
            std::str::from_utf8(field).ok()?.parse::<u64>().ok()
        };
        if let Some(n) = value(b"Threads:") {
            threads = Some(usize::try_from(n).ok()?);
        } else if let Some(kib) = value(b"VmData:") {
            data_bytes = Some(kib.checked_mul(1024)?);
        }
    }
    Some(Status {
        threads: threads?,
        data_bytes: data_bytes?,
    })
}

/// How many threads this process has: field 20 of `/proc/self/stat`, read into a stack
/// buffer. A worker asks before it joins a v1 cgroup through `tasks` ([`cgroup::join`])
/// (the zygote asks [`OwnStatus`]); what a worker writes is copied on write, since it
/// shares the zygote's pages: listing
/// `/proc/self/task` took a 32 KiB directory buffer from the heap each time, and malloc's
/// search for it touched ~20 heap pages.
fn thread_count() -> io::Result<usize> {
    let mut buf = [0u8; 1024];
    threads_in_stat(read_into(&mut buf, "/proc/self/stat")?)
        .ok_or_else(|| io::Error::other("no thread count in /proc/self/stat"))
}

/// Reads the start of `path` (a `/proc` file) into `buf`, as far as it fits, and returns
/// what was read. For a process that shares its heap with the zygote, or is the zygote:
/// a buffer on the stack copies none of the allocator's pages.
pub(crate) fn read_into<'b>(buf: &'b mut [u8], path: &str) -> io::Result<&'b [u8]> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..])? {
            0 => break,
            n => len += n,
        }
    }
    Ok(&buf[..len])
}

/// `num_threads` from the text of `/proc/PID/stat`: the 18th field after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
fn threads_in_stat(stat: &[u8]) -> Option<usize> {
    let end_of_comm = stat.iter().rposition(|&b| b == b')')?;
    let field = stat[end_of_comm + 1..]
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty())
        .nth(17)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_and_the_data_size_are_read_from_the_status_text() {
        let status = b"Name:\tzyg ote\nUmask:\t0022\nVmData:\t  123456 kB\nVmStk:\t 132 kB\n\
                       Threads:\t1\nSigQ:\t0/94321\n";
        let expected = Status {
            threads: 1,
            data_bytes: 123456 * 1024,
        };
        assert_eq!(parse_status(status), Some(expected));
        assert_eq!(parse_status(b"Name:\tx\nThreads:\t3\n"), None);
        assert_eq!(parse_status(b"VmData:\t 1 kB\n"), None);
        assert_eq!(parse_status(b"Threads:\tmany\nVmData:\t 1 kB\n"), None);
    }

    /// Runs `child` in a forked child, which has exactly one thread whatever the test
    /// harness runs, and returns the code it exits with.
    fn in_a_child(child: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the children of these tests read /proc, start and join a thread (glibc's
        // fork leaves malloc usable) and leave with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = child();
            // SAFETY: ends the child without running the harness's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// What `during` returns while a second thread runs beside this one.
    fn with_a_second_thread<T>(during: impl FnOnce() -> T) -> T {
        let (started, release) = (
            std::sync::Arc::new(std::sync::Barrier::new(2)),
            std::sync::Arc::new(std::sync::Barrier::new(2)),
        );
        let (s, r) = (started.clone(), release.clone());
        let extra = std::thread::spawn(move || {
            s.wait();
            r.wait();
        });
        started.wait();
        let seen = during();
        release.wait();
        let _ = extra.join();
        seen
    }

    #[test]
    fn a_fork_is_refused_with_a_second_thread_and_tells_the_data_size_with_one() {
        // Opened in the child: a descriptor opened before the fork names the parent.
        let code = in_a_child(|| {
            match OwnStatus::open().and_then(|own| own.before_fork().map(|a| (own, a))) {
                Ok((own, alone)) if alone.data_bytes > 0 => {
                    match with_a_second_thread(|| own.before_fork()) {
                        Err(e) if e.to_string() == "the zygote has 2 threads, expected 1" => 0,
                        Err(_) => 2,
                        Ok(_) => 4,
                    }
                }
                Ok(_) => 1,
                Err(_) => 3,
            }
        });
        assert_eq!(
            code, 0,
            "1: no data size, 2: another refusal, 3: unreadable, 4: a second thread not seen"
        );
    }

    #[test]
    fn the_thread_count_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat = b"4242 (zyg ) (ote) S 1 4242 4242 0 -1 4194560 1203 0 0 0 12 3 0 0 20 0 7 0 \
                     8675 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0\n";
        assert_eq!(threads_in_stat(stat), Some(7));
        assert_eq!(threads_in_stat(b"4242 (zygote) S 1 2"), None);
        assert_eq!(threads_in_stat(b"no command name here"), None);
    }

    #[test]
    fn the_thread_count_follows_the_threads_this_process_starts() {
        let code = in_a_child(|| match thread_count() {
            Ok(1) => match with_a_second_thread(thread_count) {
                Ok(2) => 0,
                Ok(_) => 2,
                Err(_) => 3,
            },
            Ok(_) => 1,
            Err(_) => 3,
        });
        assert_eq!(
            code, 0,
            "1: not one thread alone, 2: not two with one started, 3: unreadable"
        );
    }
}
