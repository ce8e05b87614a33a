//! The workspace root: this instance's directory, claimed with a lock held for the
//! process's lifetime ([`crate::state_lock`]), its workspaces in its `mount` directory
//! (the instance's bounded tmpfs where it may mount: [`super::bound`]); recreated if it
//! vanishes, unmounted and removed when its owner is dropped (a start-up that fails or is
//! interrupted leaves nothing behind), and the roots of dead instances (their lock free)
//! unmounted and removed. Another live instance's root is never touched, whatever PID
//! namespace it runs in. The lock file stays beside the mount, on the base file system, so
//! whether an instance is alive is judged the same way mounted or not.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::bound::{self, Bound, BoundSettings, MOUNT_DIR, WorkspaceUsage};
use crate::state_lock::{DirLock, Lock};

/// Prefix of every instance's workspace root under the shared base directory.
const ROOT_PREFIX: &str = "workspaces-";

/// The claimed root and its lock; dropping it removes the directory, on every path out
/// of a start-up as at shutdown.
#[derive(Debug)]
pub struct WorkspaceRoot {
    path: PathBuf,
    bound: Mutex<Bound>,
    lock: Mutex<Option<DirLock>>,
}

impl WorkspaceRoot {
    /// Claims `wanted` (`<base>/workspaces-<pid>`), or `wanted-1`, `wanted-2`, … when a
    /// live instance in another PID namespace has the same pid; then removes the roots
    /// under `<base>` whose owners are gone, and mounts the bounded tmpfs.
    pub fn claim(wanted: &Path, settings: &BoundSettings) -> io::Result<Self> {
        if let Some(base) = wanted.parent() {
            std::fs::create_dir_all(base)?;
        }
        let mut last = None;
        for n in 0..64 {
            let candidate = if n == 0 {
                wanted.to_path_buf()
            } else {
                let mut name = wanted.as_os_str().to_owned();
                name.push(format!("-{n}"));
                PathBuf::from(name)
            };
            match claim_one(&candidate) {
                Ok(Some(lock)) => {
                    let base = wanted.parent().unwrap_or(Path::new("/"));
                    remove_abandoned(base, &candidate);
                    let bound = mount_workspaces(&candidate, settings)?;
                    return Ok(Self {
                        path: candidate,
                        bound: Mutex::new(bound),
                        lock: Mutex::new(Some(lock)),
                    });
                }
                Ok(None) => {}
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::other(format!(
                "every workspace root name like {} is held by another live instance",
                wanted.display()
            ))
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory the workspaces are made in.
    pub fn workspaces(&self) -> PathBuf {
        self.path.join(MOUNT_DIR)
    }

    /// The workspace file system's bound and usage now (one `statvfs`, and two `stat`s
    /// to see that the tmpfs is still there).
    pub fn usage(&self) -> io::Result<WorkspaceUsage> {
        let bound = {
            let mut bound = self.bound.lock().expect("bound");
            if matches!(*bound, Bound::Mounted { .. })
                && !bound::is_mounted(&self.workspaces(), &self.path)
            {
                *bound = lost(format!(
                    "the workspaces' tmpfs at {} was unmounted under the service",
                    self.workspaces().display()
                ));
            }
            bound.clone()
        };
        bound::usage(&self.workspaces(), &bound)
    }

    /// Recreates the root (taking its lock again) when it was removed under us. Returns
    /// whether it had to. Its workspaces then stay a plain directory: a tmpfs mounted now
    /// would not appear in the running zygotes' namespaces, whose workers reach their
    /// workspace by its path.
    pub fn ensure(&self) -> io::Result<bool> {
        let mut lock = self.lock.lock().expect("root lock");
        if self.path.join(crate::state_lock::LOCK_FILE).is_file()
            && lock.is_some()
            && self.workspaces().is_dir()
        {
            return Ok(false);
        }
        std::fs::create_dir_all(&self.path)?;
        match DirLock::lock(&self.path)? {
            Lock::Taken(taken) => {
                *lock = Some(taken);
                std::fs::create_dir_all(self.workspaces())?;
                let mut bound = self.bound.lock().expect("bound");
                let why = format!(
                    "the workspace root {} was removed under the service and recreated",
                    self.path.display()
                );
                *bound = match &*bound {
                    // Already lost: the first cause stays.
                    Bound::Lost(_) => bound.clone(),
                    Bound::Mounted { .. } => lost(why),
                    Bound::Unbounded(before) => Bound::Unbounded(format!("{before}; {why}")),
                };
                tracing::warn!(path = %self.path.display(), "the workspace root had been removed; recreated it");
                Ok(true)
            }
            _ => Err(io::Error::other(format!(
                "the workspace root {} was removed and another process now holds it",
                self.path.display()
            ))),
        }
    }

    /// Unmounts (lazily) and removes the root; the lock goes with it.
    pub fn remove(&self) {
        let mut lock = self.lock.lock().expect("root lock");
        if lock.is_some() {
            unmount_workspaces(&self.path);
            let _ = super::tree::remove_tree(&self.path);
        }
        lock.take();
    }
}

impl Drop for WorkspaceRoot {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The bound gone under a running service, saying so. It is not mounted again: a tmpfs
/// mounted now would not appear in the running zygotes' private mount namespaces, where
/// workers enter their workspace by its path (they would run with no usable working
/// directory).
fn lost(why: String) -> Bound {
    let why = format!(
        "{why}: the workspaces now share the base file system, unbounded (a new tmpfs would \
         not reach the running zygotes' mount namespaces); restart the service to bound them \
         again"
    );
    tracing::error!(why, "the workspaces lost their bound");
    Bound::Lost(why)
}

/// Our lock on `dir`, creating it if need be; `None` when a live instance holds it. A
/// directory left by a dead instance with the same name is emptied and reused.
fn claim_one(dir: &Path) -> io::Result<Option<DirLock>> {
    let fresh = match std::fs::create_dir(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    if !fresh && matches!(DirLock::lock_existing(dir)?, Lock::NoLockFile) {
        // Not claimed by anyone (yet): someone may be about to; leave it.
        return Ok(None);
    }
    match DirLock::lock(dir)? {
        Lock::Taken(lock) => {
            if !fresh {
                tracing::info!(path = %dir.display(), "reusing the workspace root of an instance that is gone");
                empty_except_lock(dir)?;
            }
            Ok(Some(lock))
        }
        Lock::Held | Lock::NoLockFile => Ok(None),
    }
}

/// Makes `<root>/mount` (if need be) and mounts the bounded tmpfs on it, saying so.
fn mount_workspaces(root: &Path, settings: &BoundSettings) -> io::Result<Bound> {
    let dir = root.join(MOUNT_DIR);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let base = root.parent().unwrap_or(Path::new("/"));
    let bound = bound::mount(&dir, base, settings);
    match &bound {
        Bound::Mounted { size_bytes, inodes } => {
            tracing::info!(path = %dir.display(), size_bytes, inodes, "the workspaces are bounded by a tmpfs of their own")
        }
        Bound::Unbounded(why) | Bound::Lost(why) => {
            tracing::warn!(path = %dir.display(), why, "the workspaces are not bounded: they share the base file system")
        }
    }
    Ok(bound)
}

/// Detaches whatever is mounted at `<root>/mount` (ours, or a dead instance's).
fn unmount_workspaces(root: &Path) {
    let dir = root.join(MOUNT_DIR);
    match bound::unmount(&dir) {
        Ok(true) => tracing::info!(path = %dir.display(), "unmounted the workspaces' tmpfs"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(path = %dir.display(), error = %e, "could not unmount the workspaces' tmpfs")
        }
    }
}

fn empty_except_lock(dir: &Path) -> io::Result<()> {
    unmount_workspaces(dir);
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_name() == crate::state_lock::LOCK_FILE {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            super::tree::remove_tree(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Removes the `workspaces-*` roots under `base` whose lock can be taken (their instance
/// died without shutting down: SIGKILL, a crash); on a tmpfs they would hold memory until
/// reboot, and so would its tmpfs, mounted still. A root without a lock file is left alone: it cannot be proven abandoned.
fn remove_abandoned(base: &Path, ours: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_root = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(ROOT_PREFIX));
        if !is_root || path == ours || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        // Holding its lock while removing it: nobody can claim it meanwhile.
        if let Ok(Lock::Taken(_lock)) = DirLock::lock_existing(&path) {
            tracing::info!(path = %path.display(), "removing workspaces left by an instance that is gone");
            unmount_workspaces(&path);
            if let Err(e) = super::tree::remove_tree(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not remove abandoned workspaces");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit tests never mount: the integration tests do, against a real service.
    fn unmounted() -> BoundSettings {
        BoundSettings {
            mount: false,
            size_bytes: None,
            inodes: None,
        }
    }

    #[test]
    fn a_live_root_is_never_taken_and_a_dead_one_is_removed() {
        let base = tempfile::tempdir().unwrap();
        let wanted = base.path().join("workspaces-1");
        let a = WorkspaceRoot::claim(&wanted, &unmounted()).unwrap();
        std::fs::write(a.path().join("keep"), "a's").unwrap();
        // Same pid in another namespace: it gets a root of its own, A's stays intact.
        let b = WorkspaceRoot::claim(&wanted, &unmounted()).unwrap();
        assert_eq!(b.path(), base.path().join("workspaces-1-1"));
        assert_eq!(
            std::fs::read_to_string(a.path().join("keep")).unwrap(),
            "a's"
        );
        // A root without a lock file is not judged abandoned.
        std::fs::create_dir(base.path().join("workspaces-7")).unwrap();
        // Dropped, B removes its root.
        let b_path = b.path().to_path_buf();
        drop(b);
        assert!(!b_path.exists());
        // An instance that died (a lock file nobody holds, its directory left): the next
        // claim removes its root.
        let dead = base.path().join("workspaces-9");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(crate::state_lock::LOCK_FILE), "").unwrap();
        std::fs::write(dead.join("left"), "é").unwrap();
        let c = WorkspaceRoot::claim(&base.path().join("workspaces-2"), &unmounted()).unwrap();
        assert!(!dead.exists());
        assert!(a.path().join("keep").exists());
        assert!(base.path().join("workspaces-7").exists());
        // Removed under a running instance: recreated, with the lock taken again.
        std::fs::remove_dir_all(c.path()).unwrap();
        assert!(c.ensure().unwrap());
        assert!(!c.ensure().unwrap());
        assert!(matches!(
            DirLock::lock_existing(c.path()).unwrap(),
            Lock::Held
        ));
    }
}
