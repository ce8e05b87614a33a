//! `LocalStore`: files in a directory on local disk, the embedded default.
//!
//! Layout under the store's directory:
//!
//! ```text
//! objects/<id>        the bytes
//! meta/<id>.json      a FileMeta; its presence is what makes a file exist
//! tmp/                in-progress writes, emptied at start-up
//! .lock               locked by the instance that has the store open
//! ```
//!
//! One running instance owns the directory: it holds the lock on `.lock` for as long as it
//! runs, and a second one refuses to open it (two would empty each other's `tmp/` and
//! count quotas apart).
//!
//! A `put` streams into `tmp/`, counting bytes (past the maximum or the quota it stops and
//! deletes what it wrote), fsyncs, renames the bytes into `objects/`, then writes the
//! metadata the same way (tmp, fsync, rename). The metadata rename is the commit: a reader
//! can never see a half-written file. Deletion removes the metadata first. At start-up the
//! metadata is loaded into memory (listing and quota accounting never touch the disk), and
//! objects without metadata (a crash between the two renames) are removed.
//!
//! A directory removed under the running store (a tmp cleaner sweeping the state dir) is
//! recreated ([`recover`]): found by a write that cannot create its file, by every read,
//! listing and deletion, and by the background check; the files stored before are lost
//! and forgotten. While it cannot be recreated the store is `Unavailable` (503).

mod index;
mod recover;

use std::io::{self, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use self::index::State;
use self::recover::Recovery;
use super::{
    ByteReader, Charge, FileMeta, FileOwner, FileStore, Holders, StoreBounds, StoreError,
    StoreRecovery, UploadSize, canonical_file_id, clean_filename, mime_for, now_unix_ms,
};
use crate::state_lock::{DirLock, Lock};

#[derive(Debug, Clone, Default)]
pub struct LocalStoreSettings {
    pub dir: PathBuf,
    pub max_file_bytes: u64,
    /// The quotas and file counts.
    pub bounds: StoreBounds,
    /// What a file costs ([`Charge::for_dir`] for the store's own file system).
    pub charge: Charge,
    /// `None`: files are kept until deleted.
    pub ttl: Option<Duration>,
}

pub struct LocalStore {
    settings: LocalStoreSettings,
    state: Mutex<State>,
    /// The lock on the directory, and what its last recreation found.
    recovery: Mutex<Recovery>,
}

fn io_err(doing: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io {
        doing,
        path,
        source,
    }
}

impl LocalStore {
    /// Opens (creating it if needed) the store directory and loads its metadata.
    pub fn open(settings: LocalStoreSettings) -> Result<Self, StoreError> {
        let dir = &settings.dir;
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        let lock = match DirLock::lock(dir).map_err(io_err("locking", dir))? {
            Lock::Taken(lock) => lock,
            Lock::Held | Lock::NoLockFile => {
                return Err(StoreError::InUse { dir: dir.clone() });
            }
        };
        let state = index::load(dir, settings.charge)?;
        Ok(Self {
            settings,
            state: Mutex::new(state),
            recovery: Mutex::new(Recovery::new(lock)),
        })
    }

    /// The live files `keep` accepts, oldest first.
    fn live_files(&self, keep: impl Fn(&FileMeta) -> bool) -> Vec<FileMeta> {
        let now = now_unix_ms();
        let state = self.state.lock().expect("store lock");
        let mut files: Vec<FileMeta> = state
            .files
            .values()
            .filter(|m| !m.expired(self.settings.ttl, now) && keep(m))
            .cloned()
            .collect();
        files.sort_by(|a, b| (a.created_unix_ms, &a.file_id).cmp(&(b.created_unix_ms, &b.file_id)));
        files
    }

    fn object_path(&self, id: &str) -> PathBuf {
        self.settings.dir.join("objects").join(id)
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.settings.dir.join("meta").join(format!("{id}.json"))
    }

    fn tmp_path(&self, name: &str) -> PathBuf {
        self.settings.dir.join("tmp").join(name)
    }

    /// The live file `file_id` (in any case) if `owner` may see it; `NotFound` alike when
    /// it does not exist, expired or belongs to someone else.
    fn live(&self, file_id: &str, owner: Option<&str>) -> Result<FileMeta, StoreError> {
        let not_found = || StoreError::NotFound(file_id.to_owned());
        let id = canonical_file_id(file_id).ok_or_else(not_found)?;
        let state = self.state.lock().expect("store lock");
        let meta = state.files.get(&id).ok_or_else(not_found)?;
        if !meta.visible_to(owner) || meta.expired(self.settings.ttl, now_unix_ms()) {
            return Err(not_found());
        }
        Ok(meta.clone())
    }

    /// Whether one more file of `owner` of `upload` bytes would pass the store's bounds or
    /// the owner's.
    fn over_quota(
        &self,
        state: &State,
        owner: FileOwner<'_>,
        upload: UploadSize,
    ) -> Option<StoreError> {
        self.settings.bounds.refusal(
            state.charge,
            owner,
            (state.all, state.held_by(owner.name)),
            upload,
            || {
                let name = owner.name?;
                Some(Holders::of_full_store(name, state.charges().collect()))
            },
        )
    }

    /// Streams `body` into `tmp`, enforcing the size limit and (optimistically) the quota.
    async fn receive(
        &self,
        tmp: &Path,
        owner: FileOwner<'_>,
        body: &mut (dyn AsyncRead + Send + Unpin),
    ) -> Result<u64, StoreError> {
        // A file that cannot fit whatever its size (too many files, or not even an empty
        // file's charge): refused before its first byte.
        if let Some(refused) = {
            let state = self.state.lock().expect("store lock");
            self.over_quota(&state, owner, UploadSize::AtLeast(0))
        } {
            return Err(refused);
        }
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .await
            .map_err(io_err("creating", tmp))?;
        let written = super::copy_upload(
            body,
            &mut file,
            self.settings.max_file_bytes,
            |written, _| {
                let state = self.state.lock().expect("store lock");
                self.over_quota(&state, owner, UploadSize::AtLeast(written))
                    .map_or(Ok(()), Err)
            },
            |source| StoreError::Io {
                doing: "writing",
                path: tmp.to_path_buf(),
                source,
            },
        )
        .await?;
        // tokio's File writes in the background and keeps a failed write's error (ENOSPC on
        // a full disk) for the next write or flush: sync_all alone drops it, and an upload
        // cut short would be stored as if whole.
        file.flush().await.map_err(io_err("writing", tmp))?;
        file.sync_all().await.map_err(io_err("syncing", tmp))?;
        Ok(written)
    }

    async fn commit(&self, meta: &FileMeta, tmp_object: &Path) -> Result<(), StoreError> {
        let id = &meta.file_id;
        let object = self.object_path(id);
        tokio::fs::rename(tmp_object, &object)
            .await
            .map_err(io_err("renaming into", &object))?;
        let tmp_meta = self.tmp_path(&format!("{id}.json"));
        let json = serde_json::to_vec(meta).expect("FileMeta serialises");
        let written = async {
            let mut f = tokio::fs::File::create(&tmp_meta).await?;
            f.write_all(&json).await?;
            f.flush().await?; // the write's own error, as above
            f.sync_all().await
        }
        .await;
        if let Err(e) = written {
            // Nothing half-stored: an object without its metadata would only take space.
            let _ = tokio::fs::remove_file(&object).await;
            let _ = tokio::fs::remove_file(&tmp_meta).await;
            return Err(io_err("writing", &tmp_meta)(e));
        }
        let meta_path = self.meta_path(id);
        let renamed = tokio::fs::rename(&tmp_meta, &meta_path).await;
        if let Err(e) = renamed {
            let _ = tokio::fs::remove_file(&object).await;
            let _ = tokio::fs::remove_file(&tmp_meta).await;
            return Err(io_err("renaming into", &meta_path)(e));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl FileStore for LocalStore {
    async fn put(
        &self,
        owner: FileOwner<'_>,
        filename: &str,
        body: &mut (dyn AsyncRead + Send + Unpin),
    ) -> Result<FileMeta, StoreError> {
        // Time-ordered, as the S3 store's: a listing by id is in upload order.
        let id = uuid::Uuid::now_v7().to_string();
        let tmp = self.tmp_path(&id);
        let mut received = self.receive(&tmp, owner, body).await;
        // The directory was removed from outside: nothing of the body was read yet, so
        // the write can start again once it is recreated.
        if received.as_ref().is_err_and(recover::cannot_create) {
            self.recover()?;
            received = self.receive(&tmp, owner, body).await;
        }
        let size = match received {
            Ok(size) => size,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        // Reserve the space under the lock, so concurrent puts cannot overrun the quota.
        let reserved = {
            let mut state = self.state.lock().expect("store lock");
            match self.over_quota(&state, owner, UploadSize::Whole(size)) {
                Some(full) => Err(full),
                None => {
                    state.add(owner.name, size);
                    Ok(())
                }
            }
        };
        if let Err(full) = reserved {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(full);
        }
        let filename = clean_filename(filename);
        let meta = FileMeta {
            file_id: id.clone(),
            mime_type: mime_for(&filename),
            filename,
            size_bytes: size,
            created_unix_ms: now_unix_ms(),
            owner: owner.name.map(str::to_owned),
        };
        let committed = self.commit(&meta, &tmp).await;
        {
            let mut state = self.state.lock().expect("store lock");
            match &committed {
                Ok(()) => drop(state.files.insert(id, meta.clone())),
                Err(_) => state.sub(owner.name, size),
            }
        }
        match committed {
            Ok(()) => Ok(meta),
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                Err(e)
            }
        }
    }

    async fn meta(&self, file_id: &str, owner: Option<&str>) -> Result<FileMeta, StoreError> {
        // A store whose directory is gone cannot serve the file: unavailable, or (once
        // recreated) the file is lost.
        self.recover()?;
        self.live(file_id, owner)
    }

    async fn get(
        &self,
        file_id: &str,
        owner: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<(FileMeta, ByteReader), StoreError> {
        self.recover()?;
        let meta = self.live(file_id, owner)?;
        let object = self.object_path(&meta.file_id);
        // Once open, the bytes stay readable even if the file is deleted meanwhile.
        let mut file = match tokio::fs::File::open(&object).await {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(file_id.to_owned()));
            }
            Err(e) => return Err(io_err("opening", &object)(e)),
        };
        let Some(range) = range else {
            return Ok((meta, Box::new(file)));
        };
        // A seek, so the bytes before the range are never read.
        file.seek(SeekFrom::Start(range.start))
            .await
            .map_err(io_err("seeking in", &object))?;
        Ok((meta, Box::new(file.take(range.end - range.start))))
    }

    async fn list(&self, owner: Option<&str>) -> Result<Vec<FileMeta>, StoreError> {
        // Never list files whose directory is gone.
        self.recover()?;
        Ok(self.live_files(|m| m.visible_to(owner)))
    }

    async fn list_all(&self) -> Result<Vec<FileMeta>, StoreError> {
        Ok(self.live_files(|_| true))
    }

    async fn check(&self) -> Result<(), StoreError> {
        self.recover().map(drop)
    }

    fn last_recovery(&self) -> Option<StoreRecovery> {
        self.recovery.lock().expect("recovery lock").last.clone()
    }

    fn charging(&self) -> (Charge, StoreBounds) {
        (self.settings.charge, self.settings.bounds)
    }

    async fn delete(&self, file_id: &str, owner: Option<&str>) -> Result<(), StoreError> {
        self.recover()?;
        let meta = self.live(file_id, owner)?;
        let id = meta.file_id.as_str();

        // The metadata goes first: from then on the file does not exist for anyone.
        let meta_path = self.meta_path(id);
        match tokio::fs::remove_file(&meta_path).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(file_id.to_owned()));
            }
            Err(e) => return Err(io_err("removing", &meta_path)(e)),
        }
        {
            let mut state = self.state.lock().expect("store lock");
            if state.files.remove(id).is_some() {
                state.sub(meta.owner.as_deref(), meta.size_bytes);
            }
        }
        let _ = tokio::fs::remove_file(self.object_path(id)).await;
        Ok(())
    }

    async fn remove_expired(&self) -> Result<usize, StoreError> {
        let Some(ttl) = self.settings.ttl else {
            return Ok(0);
        };
        let now = now_unix_ms();
        let expired: Vec<FileMeta> = {
            let state = self.state.lock().expect("store lock");
            state
                .files
                .values()
                .filter(|m| m.expired(Some(ttl), now))
                .cloned()
                .collect()
        };
        let mut removed = 0;
        for meta in expired {
            let id = &meta.file_id;
            let meta_path = self.meta_path(id);
            match tokio::fs::remove_file(&meta_path).await {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing", &meta_path)(e)),
            }
            {
                let mut state = self.state.lock().expect("store lock");
                if state.files.remove(id).is_some() {
                    state.sub(meta.owner.as_deref(), meta.size_bytes);
                    removed += 1;
                }
            }
            let _ = tokio::fs::remove_file(self.object_path(id)).await;
        }
        Ok(removed)
    }
}

/// Ids on disk are UUIDs as the store writes them; anything else (a path, say) is no file.
fn valid_id(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|u| u.hyphenated().to_string() == id)
}

#[cfg(test)]
mod tests;
