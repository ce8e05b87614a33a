//! The memory of all workers together: the instance cgroup's memory limit, and the
//! kernel's count of the workers it killed for memory, by which a worker's death by
//! SIGKILL is explained to its client.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// What `limits.max_total_memory_mb` asks of the instance's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBound {
    /// `0`: no bound.
    Off,
    /// Unset: half the host's memory (`MemTotal`), or half the limit the service's own
    /// cgroup already has where that is lower. Where no memory cgroup can be made, no
    /// bound, and the layer's detail says why.
    HalfOfHost,
    /// Set: this many bytes. Where they cannot be bounded, the service does not start.
    Bytes(u64),
}

/// Sets the memory limit of the cgroup `dir` (made in `parent`) at `asked` bytes, or
/// where `None` at half the host's: the watch on its out-of-memory kills, which holds the
/// bytes the kernel took (rounded down to pages). v1 or v2 is told by the files the
/// cgroup has.
pub(super) fn limit(dir: &Path, parent: &Path, asked: Option<u64>) -> Result<OomWatch, String> {
    let v1 = dir.join("memory.limit_in_bytes").exists();
    let bytes = match asked {
        Some(bytes) => bytes,
        None => half_of_host(dir, parent, v1)?,
    };
    let (limit, swap, events, usage) = if v1 {
        (
            "memory.limit_in_bytes",
            "memory.memsw.limit_in_bytes",
            "memory.oom_control",
            "memory.usage_in_bytes",
        )
    } else {
        (
            "memory.max",
            "memory.swap.max",
            "memory.events",
            "memory.current",
        )
    };
    write(&dir.join(limit), &bytes.to_string())?;
    // Where swap is accounted, a worker past the bound is killed, not swapped out: v1
    // bounds memory and swap together at the same bytes, v2 gives the workers no swap.
    let swap = dir.join(swap);
    if swap.exists() {
        write(&swap, &if v1 { bytes.to_string() } else { "0".into() })?;
    }
    let set = read_number(&dir.join(limit))?;
    let open = |name: &str| {
        let path = dir.join(name);
        File::open(&path)
            .map(Arc::new)
            .map_err(|e| format!("opening {}: {e}", path.display()))
    };
    let watch = OomWatch {
        events: open(events)?,
        usage: open(usage)?,
        bytes: set,
    };
    if watch.kills().is_none() {
        return Err(format!(
            "{} has no oom_kill count",
            dir.join(events).display()
        ));
    }
    Ok(watch)
}

/// Half the host's memory, or of the limit our cgroup has where that is lower (v1: the
/// new cgroup's `hierarchical_memory_limit`, the least of its ancestors'; v2: `parent`'s
/// `memory.max`).
fn half_of_host(dir: &Path, parent: &Path, v1: bool) -> Result<u64, String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("reading /proc/meminfo: {e}"))?;
    let total = field(&meminfo, "MemTotal:")
        .map(|kib| kib.saturating_mul(1024))
        .ok_or("/proc/meminfo has no MemTotal")?;
    let ours = if v1 {
        std::fs::read_to_string(dir.join("memory.stat"))
            .ok()
            .and_then(|stat| field(&stat, "hierarchical_memory_limit"))
    } else {
        std::fs::read_to_string(parent.join("memory.max"))
            .ok()
            .and_then(|max| max.trim().parse().ok())
    };
    Ok(total.min(ours.unwrap_or(u64::MAX)) / 2)
}

/// The number after `name` on the line that starts with it.
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

fn write(file: &Path, value: &str) -> Result<(), String> {
    std::fs::write(file, value).map_err(|e| format!("writing {value} to {}: {e}", file.display()))
}

fn read_number(file: &Path) -> Result<u64, String> {
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    text.trim()
        .parse()
        .map_err(|e| format!("{} reads {:?}: {e}", file.display(), text.trim()))
}

/// The kernel's count of the instance's workers killed for memory (`oom_kill` of v1's
/// `memory.oom_control` or v2's `memory.events`) and their memory now (v1's
/// `memory.usage_in_bytes`, v2's `memory.current`), each file kept open and read from its
/// start.
#[derive(Debug, Clone)]
pub struct OomWatch {
    events: Arc<File>,
    usage: Arc<File>,
    bytes: u64,
}

impl OomWatch {
    /// The bound, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The count now; `None` when it cannot be read.
    pub fn kills(&self) -> Option<u64> {
        let mut buf = [0u8; 1024];
        let n = self.events.read_at(&mut buf, 0).ok()?;
        field(std::str::from_utf8(&buf[..n]).ok()?, "oom_kill ")
    }

    /// What the kernel charges all workers together now, in bytes.
    pub fn used(&self) -> Option<u64> {
        let mut buf = [0u8; 32];
        let n = self.usage.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
    }

    /// The bound, what is used of it and the kills so far (`/health`, the metrics).
    pub fn report(&self) -> WorkersMemory {
        WorkersMemory {
            limit_bytes: self.bytes,
            used_bytes: self.used(),
            oom_kills: self.kills(),
        }
    }

    /// Why a worker that died by SIGKILL (not the service's) while the count went from
    /// `before` to now most likely died, or `None` when the count did not move.
    pub fn explain(&self, before: u64) -> Option<String> {
        let now = self.kills()?;
        (now > before).then(|| {
            format!(
                "the kernel's out-of-memory killer, most likely: the instance's cgroup \
                 counted {} of its workers killed for memory while this one was alive, which \
                 happens when all workers together reach limits.max_total_memory_mb ({} MiB) or \
                 the host runs out of memory; the kernel kills the largest worker, not always the \
                 one allocating",
                now - before,
                self.bytes >> 20
            )
        })
    }
}

/// The memory of all workers together, as `/health` (`workers_memory`) and the metrics
/// report it; a value that could not be read is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WorkersMemory {
    /// `limits.max_total_memory_mb` as the kernel took it (whole pages).
    pub limit_bytes: u64,
    pub used_bytes: Option<u64>,
    /// Workers the kernel killed for memory since the instance started.
    pub oom_kills: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_and_the_usage_are_read_from_either_version_and_again_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("memory.oom_control");
        std::fs::write(&v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        let usage = dir.path().join("memory.usage_in_bytes");
        std::fs::write(&usage, "4096\n").unwrap();
        let watch = OomWatch {
            events: Arc::new(File::open(&v1).unwrap()),
            usage: Arc::new(File::open(&usage).unwrap()),
            bytes: 120 << 20,
        };
        assert_eq!(watch.kills(), Some(3));
        assert_eq!(watch.explain(3), None);
        std::fs::write(&v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n").unwrap();
        assert_eq!(watch.kills(), Some(5));
        let why = watch.explain(3).unwrap();
        assert!(
            why.contains("counted 2 of its workers killed for memory"),
            "{why}"
        );
        assert!(
            why.contains("limits.max_total_memory_mb (120 MiB)"),
            "{why}"
        );

        let v2 = dir.path().join("memory.events");
        std::fs::write(
            &v2,
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        let watch = OomWatch {
            events: Arc::new(File::open(&v2).unwrap()),
            usage: Arc::new(File::open(&usage).unwrap()),
            bytes: 1 << 30,
        };
        assert_eq!(watch.kills(), Some(1));
        assert_eq!(
            watch.report(),
            WorkersMemory {
                limit_bytes: 1 << 30,
                used_bytes: Some(4096),
                oom_kills: Some(1)
            }
        );
    }

    #[test]
    fn fields_are_whole_names() {
        let stat = "hierarchical_memory_limit 9223372036854771712\nhierarchical_memsw_limit 1\n";
        assert_eq!(
            field(stat, "hierarchical_memory_limit"),
            Some(9223372036854771712)
        );
        assert_eq!(
            field("MemTotal:       24684312 kB\n", "MemTotal:"),
            Some(24684312)
        );
        assert_eq!(field("oom_group_kill 4\n", "oom_kill "), None);
    }
}
