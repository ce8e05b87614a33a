//! The local store's index: every file's metadata in memory with the bytes used (in all
//! and per owner), loaded from disk at start-up, where half-finished writes are cleaned up.

use std::collections::HashMap;
use std::path::Path;

use super::{io_err, valid_id};
use crate::files::{Charge, FileMeta, Held, StoreError};

/// The index. What it holds is counted in charges ([`Charge`]): computed from each file's
/// size whenever the store opens, so a store written before files were charged (or under
/// another block size) is counted as it costs now, and nothing on disk changes.
pub(super) struct State {
    pub(super) files: HashMap<String, FileMeta>,
    pub(super) charge: Charge,
    /// Every stored file plus the reservations of commits in progress.
    pub(super) all: Held,
    /// The same, per owner (`None`: files stored without keys).
    by_owner: HashMap<Option<String>, Held>,
}

impl State {
    fn new(charge: Charge) -> Self {
        Self {
            files: HashMap::new(),
            charge,
            all: Held::default(),
            by_owner: HashMap::new(),
        }
    }

    /// Counts a file of `size` bytes of `owner` (its charge, and one file).
    pub(super) fn add(&mut self, owner: Option<&str>, size: u64) {
        let charged = self.charge.of(size);
        for held in [
            &mut self.all,
            self.by_owner.entry(owner.map(str::to_owned)).or_default(),
        ] {
            held.files += 1;
            held.charged = held.charged.saturating_add(charged);
        }
    }

    pub(super) fn sub(&mut self, owner: Option<&str>, size: u64) {
        let charged = self.charge.of(size);
        let key = owner.map(str::to_owned);
        let mut held = vec![&mut self.all];
        if let Some(mine) = self.by_owner.get_mut(&key) {
            held.push(mine);
        }
        for held in held {
            held.files = held.files.saturating_sub(1);
            held.charged = held.charged.saturating_sub(charged);
        }
        if self.by_owner.get(&key).is_some_and(|h| h.files == 0) {
            self.by_owner.remove(&key);
        }
    }

    /// What `owner` holds.
    pub(super) fn held_by(&self, owner: Option<&str>) -> Held {
        self.by_owner
            .get(&owner.map(str::to_owned))
            .copied()
            .unwrap_or_default()
    }

    /// Every owner's charge.
    pub(super) fn charges(&self) -> impl Iterator<Item = (Option<&str>, u64)> {
        self.by_owner
            .iter()
            .map(|(owner, held)| (owner.as_deref(), held.charged))
    }
}

/// Creates the store's directories under `dir` if needed, empties `tmp/`, loads the
/// metadata and removes what a crash left half-written.
pub(super) fn load(dir: &Path, charge: Charge) -> Result<State, StoreError> {
    for sub in ["objects", "meta", "tmp"] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(io_err("creating", &path))?;
    }
    let tmp = dir.join("tmp");
    for entry in std::fs::read_dir(&tmp).map_err(io_err("listing", &tmp))? {
        let path = entry.map_err(io_err("listing", &tmp))?.path();
        let _ = std::fs::remove_file(&path);
    }
    let mut state = State::new(charge);
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
        charged_bytes = state.all.charged,
        "file store opened"
    );
    Ok(state)
}
