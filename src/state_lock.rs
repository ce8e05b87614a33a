//! Ownership of a state directory by one running instance: an exclusive `flock` on a
//! `.lock` file inside it, held for as long as the owner lives. PIDs prove nothing (they are
//! reused, and a process in another PID namespace cannot see ours); a lock is released by
//! the kernel the moment its holder dies, however it dies. So a directory is someone's while
//! its lock is held, and abandoned only when its lock can be taken.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name inside a locked directory.
pub const LOCK_FILE: &str = ".lock";

/// A held lock on a directory; dropping it releases the lock.
#[derive(Debug)]
pub struct DirLock {
    dir: PathBuf,
    _lock: Flock<File>,
}

/// What trying to lock a directory found.
#[derive(Debug)]
pub enum Lock {
    /// We hold it now.
    Taken(DirLock),
    /// A live process holds it.
    Held,
    /// It has no lock file (nobody claimed it yet, or it is not ours to judge).
    NoLockFile,
}

impl DirLock {
    /// Locks `dir` (creating its lock file), or says who is in the way.
    pub fn lock(dir: &Path) -> io::Result<Lock> {
        Self::try_lock(dir, true)
    }

    /// Locks `dir` only if it already has a lock file: for judging someone else's
    /// directory, whose lock file we must never create.
    pub fn lock_existing(dir: &Path) -> io::Result<Lock> {
        Self::try_lock(dir, false)
    }

    fn try_lock(dir: &Path, create: bool) -> io::Result<Lock> {
        let path = dir.join(LOCK_FILE);
        if create {
            // Made, then opened read-only for the lock: a file open for writing would keep
            // its file system from being remounted read-only.
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
        }
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => {
                return Ok(Lock::NoLockFile);
            }
            Err(e) => return Err(e),
        };
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(Lock::Held),
            Err((_, errno)) => return Err(errno.into()),
        };
        // The lock file may have been removed (with its directory, by whoever held it
        // last) between our open and our lock: then we hold a lock on nothing.
        let ours = lock.metadata()?;
        match std::fs::symlink_metadata(&path) {
            Ok(now) if (now.dev(), now.ino()) == (ours.dev(), ours.ino()) => {}
            _ => {
                return Err(io::Error::other(format!(
                    "{} was removed while it was being locked",
                    path.display()
                )));
            }
        }
        Ok(Lock::Taken(DirLock {
            dir: dir.to_path_buf(),
            _lock: lock,
        }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_and_released_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let Lock::Taken(first) = DirLock::lock(dir.path()).unwrap() else {
            panic!("an unlocked directory is lockable");
        };
        // flock locks belong to the open file: a second open in the same process conflicts.
        assert!(matches!(DirLock::lock(dir.path()).unwrap(), Lock::Held));
        assert!(matches!(
            DirLock::lock_existing(dir.path()).unwrap(),
            Lock::Held
        ));
        drop(first);
        assert!(matches!(
            DirLock::lock_existing(dir.path()).unwrap(),
            Lock::Taken(_)
        ));
    }

    #[test]
    fn a_directory_without_a_lock_file_is_not_judged() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            DirLock::lock_existing(dir.path()).unwrap(),
            Lock::NoLockFile
        ));
        assert!(!dir.path().join(LOCK_FILE).exists());
    }
}
