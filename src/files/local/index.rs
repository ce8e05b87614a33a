//! The local store's index: every file's metadata in memory with the bytes used (in all
//! and per owner), loaded from disk at start-up, where half-finished writes are cleaned up.

use std::collections::HashMap;
use std::path::Path;

use super::{io_err, valid_id};
use crate::files::{FileMeta, StoreError};

#[derive(Default)]
pub(super) struct State {
    pub(super) files: HashMap<String, FileMeta>,
    /// Bytes of every stored file plus the reservations of commits in progress.
    pub(super) used_bytes: u64,
    /// The same, per owner (tenants with keys).
    used_by: HashMap<String, u64>,
}

impl State {
    pub(super) fn add(&mut self, owner: Option<&str>, bytes: u64) {
        self.used_bytes += bytes;
        if let Some(owner) = owner {
            *self.used_by.entry(owner.to_owned()).or_default() += bytes;
        }
    }

    pub(super) fn sub(&mut self, owner: Option<&str>, bytes: u64) {
        self.used_bytes -= bytes;
        if let Some(used) = owner.and_then(|o| self.used_by.get_mut(o)) {
            *used -= bytes;
        }
    }

    pub(super) fn used_by(&self, owner: Option<&str>) -> u64 {
        owner.map_or(0, |o| self.used_by.get(o).copied().unwrap_or(0))
    }
}

/// Creates the store's directories under `dir` if needed, empties `tmp/`, loads the
/// metadata and removes what a crash left half-written.
pub(super) fn load(dir: &Path) -> Result<State, StoreError> {
    for sub in ["objects", "meta", "tmp"] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(io_err("creating", &path))?;
    }
    let tmp = dir.join("tmp");
    for entry in std::fs::read_dir(&tmp).map_err(io_err("listing", &tmp))? {
        let path = entry.map_err(io_err("listing", &tmp))?.path();
        let _ = std::fs::remove_file(&path);
    }
    let mut state = State::default();
    let meta_dir = dir.join("meta");
    for entry in std::fs::read_dir(&meta_dir).map_err(io_err("listing", &meta_dir))? {
        let path = entry.map_err(io_err("listing", &meta_dir))?.path();
        let loaded = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<FileMeta>(&bytes).ok())
            .filter(|meta| {
                valid_id(&meta.file_id)
                    && path.file_name() == Some(format!("{}.json", meta.file_id).as_ref())
            });
        let Some(meta) = loaded else {
            tracing::warn!(path = %path.display(), "unreadable file metadata; removed");
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let object = dir.join("objects").join(&meta.file_id);
        match std::fs::metadata(&object) {
            Ok(m) if m.len() == meta.size_bytes => {
                state.add(meta.owner.as_deref(), meta.size_bytes);
                state.files.insert(meta.file_id.clone(), meta);
            }
            _ => {
                tracing::warn!(file_id = %meta.file_id, "stored file lost its bytes; removed");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let objects = dir.join("objects");
    for entry in std::fs::read_dir(&objects).map_err(io_err("listing", &objects))? {
        let entry = entry.map_err(io_err("listing", &objects))?;
        let name = entry.file_name();
        if !state.files.contains_key(name.to_string_lossy().as_ref()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    tracing::info!(
        dir = %dir.display(),
        files = state.files.len(),
        bytes = state.used_bytes,
        "file store opened"
    );
    Ok(state)
}
