//! The instance's cgroup (the `cgroup` sandbox layer): one per instance, bounding all its
//! workers together (`pids.max` = `limits.max_total_processes`; their memory, where a
//! memory cgroup can be made, at `limits.max_total_memory_mb`), made at start in this
//! process's own cgroup (v1: one in the `pids` hierarchy and one in the `memory` one; v2:
//! one, with `pids` and `memory` enabled for its children), removed at shutdown. Each
//! worker joins it itself as the first step of its hardening
//! (`worker/src/sandbox/cgroup.rs`); the zygotes stay outside, so a cgroup full of threads
//! never stops the pool from forking. Plain file writes: the whole interface used is
//! `mkdir`, `pids.max`, `memory.limit_in_bytes` (v1) or `memory.max` (v2),
//! `cgroup.subtree_control`, `tasks` (v1) or `cgroup.procs` (v2) and `rmdir`; the kernel's
//! count of out-of-memory kills is read from `memory.oom_control` (v1) or `memory.events`
//! (v2).
//!
//! Whose a cgroup is, is judged as for workspace roots ([`crate::state_lock`]): each
//! instance holds the lock of `<LOCK_DIR>/<name>/`, where it also records the cgroup
//! directories it made. At start, once its own cgroup is made, the records of instances
//! that are gone (their lock free) are read and their cgroups emptied and removed; a live
//! instance's are never touched, and a cgroup nobody recorded is not ours to judge.

mod detect;
mod memory;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use snakecage_worker::protocol::CgroupPlan;

use crate::state_lock::{DirLock, Lock};
pub use detect::Found;
pub use memory::{MemoryBound, OomWatch, WorkersMemory};

/// Where instances lock their cgroups' names and record their directories.
pub const LOCK_DIR: &str = "/run/snakecage/cgroups";
/// Every instance's cgroup (and lock directory) is named this and its pid.
const PREFIX: &str = "snakecage-";
/// The record of the cgroup directories an instance made, one per line.
const RECORD: &str = "cgroups";
/// How long a removal waits for the processes it killed to leave the cgroup.
const EMPTYING: Duration = Duration::from_secs(5);

/// What the pool asks of the layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSettings {
    /// Made at all (the layer is not switched off).
    pub wanted: bool,
    /// `pids.max`: processes and threads of all workers together.
    pub max_processes: u64,
    /// The memory of all workers together.
    pub memory: MemoryBound,
    /// [`LOCK_DIR`] but in tests.
    pub lock_dir: PathBuf,
}

/// Where the instance's cgroup is made: the host's, or a test's fake tree.
#[derive(Debug, Clone)]
pub struct Place {
    /// This process's cgroup for `pids`.
    pub found: Found,
    /// And for `memory` (on v2 the same directory).
    pub memory: Found,
}

impl Place {
    /// This process's cgroup, read from `/proc/self`.
    pub fn here() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let (cgroup, mounts) = (read("/proc/self/cgroup"), read("/proc/self/mountinfo"));
        Self {
            found: detect::find("pids", &cgroup, &mounts),
            memory: detect::find("memory", &cgroup, &mounts),
        }
    }
}

/// The instance's cgroup, held for the process's life: dropping it kills what is left in
/// it and removes it.
#[derive(Debug)]
pub struct InstanceCgroup {
    /// The cgroup's directory in each hierarchy it was made in.
    dirs: Vec<PathBuf>,
    lock: Option<DirLock>,
    detail: String,
    /// The file a worker writes `0` to, to move itself in ([`JOIN_V1`] or [`JOIN_V2`]).
    join_file: &'static str,
    /// The kernel's count of its workers killed for memory, where it bounds their memory.
    oom: Option<OomWatch>,
}

/// How a worker moves itself into a v1 cgroup: its one thread through `tasks`. Moving a
/// single thread that is the writer itself takes no lock every fork on the host waits for;
/// moving a whole process (`cgroup.procs`) takes the kernel's global threadgroup rwsem for
/// writing, which stalls every fork and thread exit on the host while it waits for RCU, at
/// every worker's start (at c=4 that cost the machine 0.2–0.9 ms of CPU per request). A
/// worker at this step has exactly one thread (a fork's child has only the thread that
/// forked, and nothing before this step starts one), and the threads it starts later are
/// born in its cgroup: the same as moving the process.
const JOIN_V1: &str = "tasks";
/// v2 moves processes between domain cgroups only through `cgroup.procs`.
const JOIN_V2: &str = "cgroup.procs";

impl InstanceCgroup {
    /// Claims a name and makes the cgroup at `place` with its bound, then removes what
    /// instances that are gone left. `Err`: why there is none (the layer is unavailable).
    pub fn claim(settings: &CgroupSettings, place: &Place) -> Result<Self, String> {
        let lock_dir = &settings.lock_dir;
        std::fs::create_dir_all(lock_dir)
            .map_err(|e| format!("creating {}: {e}", lock_dir.display()))?;
        let parent = match &place.found {
            Found::V1 { dir } => dir.clone(),
            Found::V2 { dir } => {
                enable(dir, "pids")?;
                dir.clone()
            }
            Found::None(why) => return Err(why.clone()),
        };
        // A cgroup already there under a free name is not ours: another instance that
        // records its names elsewhere (another /run) made it; it is never shared.
        let (name, lock) = claim_name(lock_dir, |name| parent.join(name).exists())?;
        let dir = parent.join(&name);
        let mut made = Self {
            dirs: Vec::new(),
            lock: Some(lock),
            detail: String::new(),
            join_file: match place.found {
                Found::V1 { .. } => JOIN_V1,
                _ => JOIN_V2,
            },
            oom: None,
        };
        made.make(&dir)?;
        let max = dir.join("pids.max");
        std::fs::write(&max, settings.max_processes.to_string())
            .map_err(|e| format!("writing {}: {e}", max.display()))?;
        let read =
            std::fs::read_to_string(&max).map_err(|e| format!("reading {}: {e}", max.display()))?;
        if read.trim() != settings.max_processes.to_string() {
            return Err(format!(
                "{} reads {} after {} was written",
                max.display(),
                read.trim(),
                settings.max_processes
            ));
        }
        let memory = match settings.memory {
            MemoryBound::Off => Ok("memory not bounded (limits.max_total_memory_mb = 0)".into()),
            MemoryBound::HalfOfHost => made.bound_memory(None, &place.memory, &name, &dir),
            MemoryBound::Bytes(bytes) => made.bound_memory(Some(bytes), &place.memory, &name, &dir),
        };
        let memory = match (memory, settings.memory) {
            (Ok(said), _) => said,
            // Asked for by name, it is not optional.
            (Err(why), MemoryBound::Bytes(_)) => return Err(why),
            (Err(why), _) => {
                tracing::warn!(%why, "the memory of all workers together is not bounded");
                format!("memory not bounded: {why}")
            }
        };
        // Only now, with a cgroup of its own made: an instance that cannot write the
        // hierarchy (mounted read-only in its namespace) cannot remove anything either,
        // and sweeping anyway it would hold each dead instance's lock while it failed,
        // so that an instance able to remove them passes them over.
        remove_abandoned(lock_dir);
        let version = match place.found {
            Found::V1 { .. } => "v1",
            _ => "v2",
        };
        made.detail = format!(
            "pids.max {} for all workers together (limits.max_total_processes); {memory}; cgroup {version} {}",
            settings.max_processes,
            dir.display()
        );
        Ok(made)
    }

    /// Makes the cgroup directory `dir`, recorded first: an instance killed in between
    /// leaves a record the next start acts on.
    fn make(&mut self, dir: &Path) -> Result<(), String> {
        let lock = self.lock.as_ref().expect("held until removed");
        let record: String = self
            .dirs
            .iter()
            .map(PathBuf::as_path)
            .chain([dir])
            .map(|d| format!("{}\n", d.display()))
            .collect();
        std::fs::write(lock.dir().join(RECORD), record)
            .map_err(|e| format!("recording the cgroup in {}: {e}", lock.dir().display()))?;
        std::fs::create_dir(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        self.dirs.push(dir.to_owned());
        Ok(())
    }

    /// Bounds the workers' memory together at `asked` bytes (`None`: half the host's):
    /// on v1 in a cgroup of the same `name` made in the memory hierarchy at `found`, on v2
    /// in the cgroup `made` (with the memory controller handed down to it). What the detail
    /// says of it, or why not.
    fn bound_memory(
        &mut self,
        asked: Option<u64>,
        found: &Found,
        name: &str,
        made: &Path,
    ) -> Result<String, String> {
        // `own`: a cgroup of its own made here (v1), named in the detail, removed should
        // the limit fail.
        let (dir, parent, own) = match found {
            Found::V1 { dir: parent } => {
                let dir = parent.join(name);
                self.make(&dir)?;
                (dir, parent.clone(), true)
            }
            // The cgroup made is v2's only where pids is on v2 too.
            Found::V2 { .. } if self.join_file == JOIN_V1 => {
                return Err(
                    "the memory controller is on cgroup v2 while pids is on v1, a mix the instance's cgroup does not span"
                        .into(),
                );
            }
            Found::V2 { dir: parent } => {
                enable(parent, "memory")?;
                (made.to_owned(), parent.clone(), false)
            }
            Found::None(why) => return Err(why.clone()),
        };
        match memory::limit(&dir, &parent, asked) {
            Ok(oom) => {
                let said = format!(
                    "memory {} MiB for all workers together (limits.max_total_memory_mb)",
                    oom.bytes() >> 20
                );
                self.oom = Some(oom);
                Ok(if own {
                    format!("{said} in {}", dir.display())
                } else {
                    said
                })
            }
            Err(why) => {
                if own && std::fs::remove_dir(&dir).is_ok() {
                    self.dirs.pop();
                }
                Err(why)
            }
        }
    }

    /// The kernel's count of its workers killed for memory, where it bounds their memory.
    pub fn oom_watch(&self) -> Option<OomWatch> {
        self.oom.clone()
    }

    /// The plan every zygote hands its workers: join this cgroup.
    pub fn plan(&self) -> CgroupPlan {
        CgroupPlan::Join {
            procs: self.dirs.iter().map(|d| d.join(self.join_file)).collect(),
            detail: self.detail.clone(),
        }
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Kills what is left in the cgroup, removes it and releases its name. Once.
    pub fn remove(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        let mut all = true;
        for dir in &self.dirs {
            if let Err(e) = empty_and_remove(dir) {
                all = false;
                tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove the instance's cgroup");
            }
        }
        if all {
            let _ = std::fs::remove_file(lock.dir().join(RECORD));
            let _ = std::fs::remove_file(lock.dir().join(crate::state_lock::LOCK_FILE));
            let _ = std::fs::remove_dir(lock.dir());
        }
    }
}

impl Drop for InstanceCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// What the layer reports and the workers are told, for `settings` at `place`: the
/// cgroup made (kept in the returned value) or why there is none.
pub fn set_up(settings: &CgroupSettings, place: &Place) -> (Option<InstanceCgroup>, CgroupPlan) {
    if !settings.wanted {
        // Shown only should a reload take the layer out of sandbox.layers_off: the cgroup
        // is made at start or not at all.
        return (
            None,
            CgroupPlan::Unavailable(
                "switched off by sandbox.layers_off when the service started; restart to make the cgroup".into(),
            ),
        );
    }
    match InstanceCgroup::claim(settings, place) {
        Ok(cgroup) => {
            tracing::info!(dirs = ?cgroup.dirs(), max_processes = settings.max_processes, memory = ?cgroup.oom.as_ref().map(OomWatch::bytes), "the workers are bounded together by a cgroup of the instance's own");
            let plan = cgroup.plan();
            (Some(cgroup), plan)
        }
        Err(why) => {
            tracing::warn!(%why, "no cgroup for the workers: they are bounded one by one only");
            (None, CgroupPlan::Unavailable(why))
        }
    }
}

/// Tells every tier's zygote of `settings` what its workers do about the cgroup.
pub(super) fn plan_with(settings: &mut super::PoolSettings, plan: &CgroupPlan) {
    for tier in &mut settings.tiers {
        tier.zygote.sandbox.cgroup = plan.clone();
    }
}

/// Our lock on `<lock_dir>/snakecage-<pid>`, or `-1`, `-2`, … when a live instance in
/// another PID namespace has the name, or a cgroup of that name exists (`in_use`).
fn claim_name(lock_dir: &Path, in_use: impl Fn(&str) -> bool) -> Result<(String, DirLock), String> {
    let pid = std::process::id();
    for n in 0..64 {
        let name = if n == 0 {
            format!("{PREFIX}{pid}")
        } else {
            format!("{PREFIX}{pid}-{n}")
        };
        let dir = lock_dir.join(&name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("creating {}: {e}", dir.display())),
        }
        match DirLock::lock(&dir) {
            Ok(Lock::Taken(lock)) => {
                // A dead instance's of the same name (its record not yet acted on: it
                // appeared after the sweep) is cleaned before the name is reused.
                remove_recorded(&dir);
                if in_use(&name) {
                    continue;
                }
                return Ok((name, lock));
            }
            Ok(Lock::Held | Lock::NoLockFile) => {}
            Err(e) => return Err(format!("locking {}: {e}", dir.display())),
        }
    }
    Err(format!(
        "every cgroup name like {PREFIX}{pid} in {} is held by another live instance",
        lock_dir.display()
    ))
}

/// Removes the cgroups recorded under `lock_dir` by instances that are gone (their lock
/// can be taken), and their records.
fn remove_abandoned(lock_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(lock_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let named = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(PREFIX));
        if !named || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = entry.path();
        // Holding its lock while removing: nobody can claim the name meanwhile.
        if let Ok(Lock::Taken(_lock)) = DirLock::lock_existing(&dir)
            && remove_recorded(&dir)
        {
            let _ = std::fs::remove_file(dir.join(crate::state_lock::LOCK_FILE));
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// Empties and removes every cgroup recorded in the lock directory `dir` (whose lock the
/// caller holds); true when none is left.
fn remove_recorded(dir: &Path) -> bool {
    let record = dir.join(RECORD);
    let Ok(text) = std::fs::read_to_string(&record) else {
        return true;
    };
    let mut all = true;
    for cgroup in text.lines().filter(|l| !l.is_empty()).map(PathBuf::from) {
        tracing::info!(cgroup = %cgroup.display(), "removing the cgroup of an instance that is gone");
        if let Err(e) = empty_and_remove(&cgroup) {
            all = false;
            tracing::warn!(cgroup = %cgroup.display(), error = %e, "could not remove the cgroup of an instance that is gone");
        }
    }
    if all {
        let _ = std::fs::remove_file(&record);
    }
    all
}

/// SIGKILLs every process in the cgroup `dir` (workers only ever: nothing else joins it)
/// until it is empty, then removes it. A cgroup that is not there is done.
fn empty_and_remove(dir: &Path) -> io::Result<()> {
    let deadline = Instant::now() + EMPTYING;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {}
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if pid > 0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// cgroup v2: a child of `dir` gets a controller's files (`pids.max`, `memory.max`) only
/// where `dir` hands the controller down (`cgroup.subtree_control`), which needs it
/// available there.
fn enable(dir: &Path, controller: &str) -> Result<(), String> {
    let controllers = dir.join("cgroup.controllers");
    let available = std::fs::read_to_string(&controllers)
        .map_err(|e| format!("cgroup v2: reading {}: {e}", controllers.display()))?;
    if !available.split_whitespace().any(|c| c == controller) {
        return Err(format!(
            "cgroup v2: the {controller} controller is not delegated to {} (its cgroup.controllers: {:?}); give the service a cgroup with {controller} enabled (e.g. systemd Delegate=yes)",
            dir.display(),
            available.trim()
        ));
    }
    let subtree = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&subtree).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == controller) {
        return Ok(());
    }
    std::fs::write(&subtree, format!("+{controller}")).map_err(|e| {
        let busy = if e.raw_os_error() == Some(libc::EBUSY) {
            " (a v2 cgroup that holds processes may hand down only threaded controllers such as pids: run the service in a cgroup of its own, below the delegated one)"
        } else {
            ""
        };
        format!(
            "cgroup v2: enabling {controller} for the children of {} ({}): {e}{busy}",
            dir.display(),
            subtree.display()
        )
    })
}

#[cfg(test)]
mod tests;
