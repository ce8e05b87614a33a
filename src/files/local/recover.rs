//! Recreating the local store's directories when they were removed under the running
//! service (a tmp cleaner sweeping the default state dir under /tmp): the directories and
//! the lock come back, the files whose metadata or bytes went with them are forgotten (a
//! listing must not offer them), and the loss is logged and kept for `/health`.

use std::io;
use std::path::Path;

use super::{LocalStore, io_err};
use crate::files::{StoreError, StoreRecovery, now_unix_ms, rfc3339_utc};
use crate::state_lock::{DirLock, LOCK_FILE, Lock};

/// The store's subdirectories; the lock file beside them.
const SUBDIRS: [&str; 3] = ["objects", "meta", "tmp"];

/// The lock on the store's directory, and the last recreation.
pub(super) struct Recovery {
    _lock: DirLock,
    pub(super) last: Option<StoreRecovery>,
}

impl Recovery {
    pub(super) fn new(lock: DirLock) -> Self {
        Self {
            _lock: lock,
            last: None,
        }
    }
}

/// Whether `error` is a write that could not create its file because its directory is
/// gone, or is no directory any more (nothing of the body was read then).
pub(super) fn cannot_create(error: &StoreError) -> bool {
    matches!(error, StoreError::Io { doing: "creating", source, .. }
        if matches!(source.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory))
}

/// Whether every directory of the store (and its lock file) is in place.
fn intact(dir: &Path) -> bool {
    SUBDIRS.iter().all(|sub| dir.join(sub).is_dir()) && dir.join(LOCK_FILE).is_file()
}

impl LocalStore {
    /// Recreates the store's directories and lock if any is missing, forgets the files
    /// that went with them; returns whether it had to. An error: the directory cannot be
    /// recreated, and the store is [`StoreError::Unavailable`] until it can be (a 503
    /// saying why, as for an object store that cannot be reached; the files it knows of
    /// are kept, and served again if the directory comes back).
    pub(super) fn recover(&self) -> Result<bool, StoreError> {
        let dir = &self.settings.dir;
        let mut recovery = self.recovery.lock().expect("recovery lock");
        if intact(dir) {
            return Ok(false);
        }
        self.recreate(&mut recovery)
            .map_err(|e| StoreError::Unavailable {
                doing: "recreating its directory",
                detail: match e {
                    // Another instance took the recreated directory: its own words say
                    // what to do.
                    e @ StoreError::InUse { .. } => e.to_string(),
                    e => format!(
                        "its directory {} is gone and cannot be recreated ({e}); make it a \
                         directory the service can write, or set files.dir",
                        dir.display()
                    ),
                },
            })
    }

    fn recreate(&self, recovery: &mut Recovery) -> Result<bool, StoreError> {
        let dir = &self.settings.dir;
        // Our lock file still there: the lock we hold is on it.
        let relock = !dir.join(LOCK_FILE).is_file();
        for sub in SUBDIRS {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(io_err("creating", &path))?;
        }
        if relock {
            match DirLock::lock(dir).map_err(io_err("locking", dir))? {
                Lock::Taken(lock) => recovery._lock = lock,
                Lock::Held | Lock::NoLockFile => {
                    return Err(StoreError::InUse { dir: dir.clone() });
                }
            }
        }
        let lost = self.forget_lost();
        let detail = format!(
            "the file store's directory {} had been removed from outside the service; \
             recreated it: the {lost} file(s) stored before are lost",
            dir.display()
        );
        tracing::error!(dir = %dir.display(), lost_files = lost, "{detail}");
        recovery.last = Some(StoreRecovery {
            at: rfc3339_utc(now_unix_ms() / 1000),
            lost_files: lost,
            detail,
        });
        Ok(true)
    }

    /// Drops from the index (and the quota) every file whose metadata or bytes are gone;
    /// returns how many.
    fn forget_lost(&self) -> usize {
        let mut state = self.state.lock().expect("store lock");
        let lost: Vec<(String, Option<String>, u64)> = state
            .files
            .values()
            .filter(|m| {
                !self.meta_path(&m.file_id).is_file() || !self.object_path(&m.file_id).is_file()
            })
            .map(|m| (m.file_id.clone(), m.owner.clone(), m.size_bytes))
            .collect();
        for (id, owner, size) in &lost {
            state.files.remove(id);
            state.sub(owner.as_deref(), *size);
        }
        lost.len()
    }
}
