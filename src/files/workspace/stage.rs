//! Staging: stored files copied into a run's workspace at the paths a request names,
//! and the fingerprints that tell new and changed files from inputs after the run.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::files::{FileStore, StoreError};

/// A stored file to place in the workspace at a normalised relative `path`.
#[derive(Debug, Clone)]
pub struct StageInput {
    pub path: String,
    pub file_id: String,
}

/// What staging left in the workspace, to tell new and changed files from inputs after the
/// run.
#[derive(Debug, Default, Clone)]
pub struct Staged {
    pub(super) files: HashMap<String, Fingerprint>,
    pub(super) dirs: HashSet<String>,
    /// Entries that are never stored (links, fifos, names that are not UTF-8), so a
    /// session reports each as skipped once, and again only when it is replaced.
    pub(super) others: HashMap<String, Fingerprint>,
}

/// Enough of a file's status to notice any write: a write or `utime` changes ctime, which
/// user code cannot set back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fingerprint {
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Fingerprint {
    pub(super) fn of(m: &std::fs::Metadata) -> Self {
        Self {
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("File with ID '{file_id}' not found for path '{path}'")]
    NotFound { file_id: String, path: String },
    #[error("cannot stage file at '{path}': {reason}")]
    Conflict { path: String, reason: String },
    #[error("staging '{path}': {source}")]
    Store { path: String, source: StoreError },
    /// The kernel refused the name (ENAMETOOLONG): the workspace's path plus `path` is
    /// beyond PATH_MAX, or a component beyond NAME_MAX.
    #[error(
        "cannot stage file at {}: the name is too long for the file system (PATH_MAX / NAME_MAX)",
        super::shown(path)
    )]
    NameTooLong { path: String },
    /// The workspace's file system is full (ENOSPC, EDQUOT).
    #[error(
        "cannot stage file at {}: the workspace has no space left for the staged files",
        super::shown(path)
    )]
    NoSpace { path: String },
    #[error("staging '{path}': {source}")]
    Io { path: String, source: io::Error },
}

/// Copies each input (stored files `tenant` may see) from the store into `workspace`, creating parent directories, all
/// owned by the workspace directory's owner (the worker's uid when workers drop
/// privileges).
pub async fn stage(
    store: &dyn FileStore,
    tenant: Option<&str>,
    workspace: &Path,
    inputs: &[StageInput],
) -> Result<Staged, StageError> {
    let mut staged = Staged::default();
    if inputs.is_empty() {
        return Ok(staged);
    }
    let owner = std::fs::metadata(workspace).map_err(|source| StageError::Io {
        path: ".".into(),
        source,
    })?;
    let owner = Owner {
        uid: owner.uid(),
        gid: owner.gid(),
    };
    for input in inputs {
        let path = &input.path;
        let io_err = |source: io::Error| match source.kind() {
            io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => StageError::Conflict {
                path: path.clone(),
                reason: "something in the workspace is in the way: a file where a directory is \
                         needed, a symbolic link (staging never writes through one), or a path \
                         given twice"
                    .into(),
            },
            _ => match source.raw_os_error() {
                Some(libc::ENAMETOOLONG) => StageError::NameTooLong { path: path.clone() },
                Some(libc::ENOSPC | libc::EDQUOT) => StageError::NoSpace { path: path.clone() },
                _ => StageError::Io {
                    path: path.clone(),
                    source,
                },
            },
        };
        let (_, mut reader) = store
            .get(&input.file_id, tenant)
            .await
            .map_err(|e| match e {
                StoreError::NotFound(_) => StageError::NotFound {
                    file_id: input.file_id.clone(),
                    path: path.clone(),
                },
                source => StageError::Store {
                    path: path.clone(),
                    source,
                },
            })?;
        let mut dir = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            if !dir.is_empty() {
                dir.push('/');
            }
            dir.push_str(part);
            if staged.dirs.contains(&dir) {
                continue;
            }
            let abs = workspace.join(&dir);
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&abs)
                .map_err(io_err)?;
            owner.apply(&abs).map_err(io_err)?;
            staged.dirs.insert(dir.clone());
        }
        let abs = workspace.join(path);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&abs)
            .map_err(io_err)?;
        let mut file = tokio::fs::File::from_std(file);
        tokio::io::copy(&mut reader, &mut file)
            .await
            .map_err(io_err)?;
        drop(file);
        owner.apply(&abs).map_err(io_err)?;
        let meta = std::fs::symlink_metadata(&abs).map_err(io_err)?;
        staged.files.insert(path.clone(), Fingerprint::of(&meta));
    }
    Ok(staged)
}

impl Staged {
    /// Nothing was staged.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.dirs.is_empty() && self.others.is_empty()
    }

    /// Adds what `other` staged (a session's later staging on top of its baseline).
    pub fn merge(&mut self, other: Staged) {
        self.files.extend(other.files);
        self.dirs.extend(other.dirs);
        self.others.extend(other.others);
    }

    /// Whether the entry at `path` (named lossily when its name is not UTF-8) is in the
    /// baseline unchanged, as whatever kind it is.
    pub(super) fn has_unchanged(&self, path: &str, meta: &std::fs::Metadata) -> bool {
        let kind = meta.file_type();
        if kind.is_dir() {
            self.dirs.contains(path)
        } else if kind.is_file() {
            self.files.get(path) == Some(&Fingerprint::of(meta))
        } else {
            self.others.get(path) == Some(&Fingerprint::of(meta))
        }
    }
}

/// The workspace as it is now, as a baseline for the next [`collect`]: a session reports
/// each file once, and again only when it changes. Looks at most `max_entries` entries;
/// links are not followed.
pub async fn snapshot(workspace: &Path, max_entries: usize) -> Staged {
    let root = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut staged = Staged::default();
        let mut seen = 0usize;
        let mut pending = vec![String::new()];
        while let Some(prefix) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(root.join(&prefix)) else {
                continue;
            };
            for entry in entries.flatten() {
                seen += 1;
                if seen > max_entries {
                    return staged;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                let rel = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                let Ok(meta) = entry.metadata() else { continue };
                if meta.file_type().is_dir() {
                    staged.dirs.insert(rel.clone());
                    pending.push(rel);
                } else if meta.file_type().is_file() {
                    staged.files.insert(rel, Fingerprint::of(&meta));
                } else {
                    staged.others.insert(rel, Fingerprint::of(&meta));
                }
            }
        }
        staged
    })
    .await
    .unwrap_or_default()
}

struct Owner {
    uid: u32,
    gid: u32,
}

impl Owner {
    fn apply(&self, path: &Path) -> io::Result<()> {
        // SAFETY: geteuid/getegid only read the process's credentials.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if (self.uid, self.gid) == (euid, egid) {
            return Ok(());
        }
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))
    }
}
