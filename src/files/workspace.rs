//! Files in and out of a run's workspace: checking the paths a request names, staging stored
//! files at those paths before the job runs, and after it storing every new or changed file
//! (and listing every new directory).
//!
//! The scan never follows a symbolic link: links, FIFOs, sockets and devices the job made
//! are not stored, and reported as skipped. It is bounded (entries looked at, bytes stored)
//! so a job that writes 100k files cannot stall the service.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path};

use serde::Serialize;

use super::{FileOwner, FileStore, StoreError};

/// The name the runner compiles `code` under; a staged file may not take it.
pub const RESERVED_NAME: &str = "__main__.py";

/// Checks a workspace path from a request and returns it normalised (`./a//b` ⇒ `a/b`).
/// The message says what is wrong with it.
pub fn normalize_path(raw: &str) -> Result<String, String> {
    if raw.contains('\0') {
        return Err(format!("File path {raw:?} contains a NUL byte."));
    }
    let mut parts = Vec::new();
    for component in Path::new(raw).components() {
        match component {
            Component::RootDir | Component::Prefix(_) => {
                return Err("File paths must be relative.".to_owned());
            }
            Component::ParentDir => {
                return Err(format!(
                    "File path {raw:?} must not contain '..': files are staged inside the workspace."
                ));
            }
            Component::CurDir => {}
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
        }
    }
    if parts.is_empty() {
        return Err(format!("File path {raw:?} names no file."));
    }
    let path = parts.join("/");
    if path == RESERVED_NAME {
        return Err(format!(
            "File path {RESERVED_NAME:?} is reserved for the submitted code; choose another name."
        ));
    }
    Ok(path)
}

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
    files: HashMap<String, Fingerprint>,
    dirs: HashSet<String>,
}

/// Enough of a file's status to notice any write: a write or `utime` changes ctime, which
/// user code cannot set back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Fingerprint {
    fn of(m: &std::fs::Metadata) -> Self {
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
        let io_err = |source: io::Error| {
            match source.kind() {
            io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => StageError::Conflict {
                path: path.clone(),
                reason: "another staged file is in the way (a path given twice, or a file used as a directory)".into(),
            },
            _ => StageError::Io {
                path: path.clone(),
                source,
            },
        }
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
    /// Adds what `other` staged (a session's later staging on top of its baseline).
    pub fn merge(&mut self, other: Staged) {
        self.files.extend(other.files);
        self.dirs.extend(other.dirs);
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

/// One entry of an execute response's `files`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WorkspaceFile {
    pub path: String,
    pub kind: EntryKind,
    /// `None` for directories.
    pub file_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Directory,
}

/// A workspace entry that was not stored, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SkippedFile {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Clone, Copy)]
pub struct CollectLimits {
    /// Entries (files, directories, anything) looked at.
    pub max_entries: usize,
    /// Bytes stored in total.
    pub max_total_bytes: u64,
}

#[derive(Debug, Default)]
pub struct Collected {
    pub files: Vec<WorkspaceFile>,
    pub skipped: Vec<SkippedFile>,
}

/// Stores every new or changed regular file of `workspace` and lists new directories. Call
/// it only once the worker is dead, so nothing changes underneath.
pub async fn collect(
    store: &dyn FileStore,
    owner: FileOwner<'_>,
    workspace: &Path,
    staged: &Staged,
    limits: CollectLimits,
) -> Collected {
    let root = workspace.to_path_buf();
    let staged_for_scan = staged.clone();
    let scan = tokio::task::spawn_blocking(move || scan(&root, &staged_for_scan, limits))
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "workspace scan panicked");
            Scan::default()
        });
    let mut out = Collected {
        files: Vec::new(),
        skipped: scan.skipped,
    };
    let mut total = 0u64;
    for entry in scan.entries {
        let (path, len) = match entry {
            Found::Directory(path) => {
                out.files.push(WorkspaceFile {
                    path,
                    kind: EntryKind::Directory,
                    file_id: None,
                    size_bytes: None,
                    mime_type: None,
                });
                continue;
            }
            Found::File { path, len } => (path, len),
        };
        if total + len > limits.max_total_bytes {
            out.skipped.push(SkippedFile {
                reason: format!(
                    "the run's files exceed the workspace budget of {} MB",
                    limits.max_total_bytes >> 20
                ),
                path,
            });
            continue;
        }
        match store_one(store, owner, workspace, &path).await {
            Ok(meta) => {
                total += meta.size_bytes;
                out.files.push(WorkspaceFile {
                    path,
                    kind: EntryKind::File,
                    file_id: Some(meta.file_id),
                    size_bytes: Some(meta.size_bytes),
                    mime_type: Some(meta.mime_type),
                });
            }
            Err(e) => {
                let reason = match &e {
                    StoreError::TooLarge { max_bytes } => {
                        format!(
                            "larger than the maximum file size of {} MB",
                            max_bytes >> 20
                        )
                    }
                    StoreError::QuotaExceeded { .. } => "the file storage quota is used up".into(),
                    StoreError::OwnerQuotaExceeded { quota_bytes, .. } => format!(
                        "the API key's storage quota of {} MB is used up",
                        quota_bytes >> 20
                    ),
                    StoreError::Unavailable { .. } => {
                        tracing::warn!(path, error = %e, "storing a workspace file failed");
                        format!("could not be stored: {e}")
                    }
                    _ => {
                        tracing::error!(path, error = %e, "storing a workspace file failed");
                        "could not be stored (internal error)".into()
                    }
                };
                out.skipped.push(SkippedFile { path, reason });
            }
        }
    }
    out
}

async fn store_one(
    store: &dyn FileStore,
    owner: FileOwner<'_>,
    workspace: &Path,
    path: &str,
) -> Result<super::FileMeta, StoreError> {
    let abs = workspace.join(path);
    let io_err = |source| StoreError::Io {
        doing: "reading",
        path: abs.clone(),
        source,
    };
    // O_NOFOLLOW: the scan saw a regular file; never read through a link put in its place.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&abs)
        .map_err(io_err)?;
    if !file.metadata().map_err(io_err)?.is_file() {
        return Err(io_err(io::Error::other("no longer a regular file")));
    }
    let mut file = tokio::fs::File::from_std(file);
    let name = path.rsplit('/').next().unwrap_or(path);
    store.put(owner, name, &mut file).await
}

#[derive(Debug, PartialEq, Eq)]
enum Found {
    Directory(String),
    File { path: String, len: u64 },
}

#[derive(Debug, Default)]
struct Scan {
    entries: Vec<Found>,
    skipped: Vec<SkippedFile>,
}

/// Depth-first pre-order, names sorted, a directory before its contents; never follows a
/// link.
fn scan(root: &Path, staged: &Staged, limits: CollectLimits) -> Scan {
    enum Item {
        Entry(String, std::fs::Metadata),
        Expand(String),
    }
    let mut out = Scan::default();
    let mut seen = 0usize;
    let mut stack = vec![Item::Expand(String::new())];
    while let Some(item) = stack.pop() {
        let prefix = match item {
            Item::Expand(prefix) => prefix,
            Item::Entry(rel, meta) => {
                let kind = meta.file_type();
                if kind.is_dir() {
                    if !staged.dirs.contains(&rel) {
                        out.entries.push(Found::Directory(rel.clone()));
                    }
                    stack.push(Item::Expand(rel));
                } else if kind.is_file() {
                    if staged.files.get(&rel) != Some(&Fingerprint::of(&meta)) {
                        out.entries.push(Found::File {
                            path: rel,
                            len: meta.len(),
                        });
                    }
                } else {
                    let what = if kind.is_symlink() {
                        "a symbolic link"
                    } else {
                        "not a regular file"
                    };
                    out.skipped.push(SkippedFile {
                        path: rel,
                        reason: format!("{what}; only regular files are stored"),
                    });
                }
                continue;
            }
        };
        let entries = match std::fs::read_dir(root.join(&prefix)) {
            Ok(entries) => entries,
            Err(e) => {
                out.skipped.push(SkippedFile {
                    path: if prefix.is_empty() {
                        ".".into()
                    } else {
                        prefix
                    },
                    reason: format!("could not be listed: {e}"),
                });
                continue;
            }
        };
        let mut children = Vec::new();
        for entry in entries.flatten() {
            seen += 1;
            if seen > limits.max_entries {
                out.skipped.push(SkippedFile {
                    path: if prefix.is_empty() {
                        ".".into()
                    } else {
                        prefix
                    },
                    reason: format!(
                        "the workspace has more than {} entries; the rest was not looked at",
                        limits.max_entries
                    ),
                });
                return out;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                out.skipped.push(SkippedFile {
                    path: join(&prefix, &name.to_string_lossy()),
                    reason: "the name is not valid UTF-8".into(),
                });
                continue;
            };
            let rel = join(&prefix, name);
            // DirEntry::metadata is lstat: a link is reported as a link.
            match entry.metadata() {
                Ok(meta) => children.push(Item::Entry(rel, meta)),
                Err(e) => out.skipped.push(SkippedFile {
                    path: rel,
                    reason: format!("could not be read: {e}"),
                }),
            }
        }
        let name_of = |item: &Item| match item {
            Item::Entry(rel, _) | Item::Expand(rel) => rel.clone(),
        };
        // Reverse order on the stack: the first name is handled (and expanded) first.
        children.sort_by_key(|item| std::cmp::Reverse(name_of(item)));
        stack.extend(children);
    }
    out
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_and_escapes_refused() {
        assert_eq!(normalize_path("data/in.csv").unwrap(), "data/in.csv");
        assert_eq!(normalize_path("./data//in.csv").unwrap(), "data/in.csv");
        assert_eq!(
            normalize_path("/etc/passwd").unwrap_err(),
            "File paths must be relative."
        );
        assert!(normalize_path("a/../../x").unwrap_err().contains("'..'"));
        assert!(normalize_path("..").unwrap_err().contains("'..'"));
        assert!(
            normalize_path("__main__.py")
                .unwrap_err()
                .contains("reserved")
        );
        assert_eq!(
            normalize_path("lib/__main__.py").unwrap(),
            "lib/__main__.py"
        );
        assert!(normalize_path("").is_err());
        assert!(normalize_path(".").is_err());
        assert!(normalize_path("a\0b").is_err());
    }

    fn limits() -> CollectLimits {
        CollectLimits {
            max_entries: 100,
            max_total_bytes: 1 << 20,
        }
    }

    #[test]
    fn the_scan_lists_new_things_in_order_and_skips_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("z.txt"), "z").unwrap();
        std::fs::write(root.join("b/c/deep.txt"), "deep").unwrap();
        std::fs::write(root.join("b/one.txt"), "1").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        let found = scan(root, &Staged::default(), limits());
        let file = |p: &str, len| Found::File {
            path: p.into(),
            len,
        };
        let dir_ = |p: &str| Found::Directory(p.into());
        assert_eq!(
            found.entries,
            vec![
                dir_("a"),
                dir_("b"),
                dir_("b/c"),
                file("b/c/deep.txt", 4),
                file("b/one.txt", 1),
                file("z.txt", 1),
            ]
        );
        assert_eq!(found.skipped.len(), 1);
        assert_eq!(found.skipped[0].path, "link");
        assert!(found.skipped[0].reason.contains("symbolic link"));
    }

    #[test]
    fn unchanged_inputs_are_not_listed_and_the_scan_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("in")).unwrap();
        std::fs::write(root.join("in/a.csv"), "a").unwrap();
        std::fs::write(root.join("in/b.csv"), "b").unwrap();
        let mut staged = Staged::default();
        staged.dirs.insert("in".into());
        for p in ["in/a.csv", "in/b.csv"] {
            let m = std::fs::metadata(root.join(p)).unwrap();
            staged.files.insert(p.into(), Fingerprint::of(&m));
        }
        std::fs::write(root.join("in/b.csv"), "changed").unwrap();
        let found = scan(root, &staged, limits());
        assert_eq!(
            found.entries,
            vec![Found::File {
                path: "in/b.csv".into(),
                len: 7
            }]
        );
        for i in 0..20 {
            std::fs::write(root.join(format!("f{i}")), "x").unwrap();
        }
        let found = scan(
            root,
            &staged,
            CollectLimits {
                max_entries: 10,
                max_total_bytes: 1 << 20,
            },
        );
        assert!(found.entries.len() <= 10);
        assert!(found.skipped[0].reason.contains("more than 10 entries"));
    }
}
