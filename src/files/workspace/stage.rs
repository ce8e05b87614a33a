//! Staging: stored files copied into a run's workspace at the paths a request names,
//! and the fingerprints that tell new and changed files from inputs after the run.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use super::MAX_PATH_BYTES;
use super::beneath::{MAX_DEPTH, Root, list, open_dir_at};
use super::footprint::Footprint;
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
    /// What the workspace takes, when this is a [`snapshot`] that could read it.
    pub(super) footprint: Option<Footprint>,
}

impl Staged {
    /// What the workspace took when this snapshot was taken; `None` for staged inputs, or
    /// a workspace that could not be opened.
    pub fn footprint(&self) -> Option<Footprint> {
        self.footprint
    }
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
    /// The file system all of the service's workspaces share is full (ENOSPC, EDQUOT):
    /// a condition of the service, not of the caller's request, which frees itself as the
    /// running jobs end.
    #[error(
        "cannot stage file at {}: the service's workspace space is exhausted (shared by all running jobs and sessions, freed as they end); retry later",
        super::shown(path)
    )]
    NoSpace { path: String },
    #[error("staging '{path}': {source}")]
    Io { path: String, source: io::Error },
}

/// Copies each input (stored files `tenant` may see) from the store into `workspace`,
/// creating parent directories, all owned by the workspace directory's owner (the worker's
/// uid when workers drop privileges).
///
/// A session's workspace already holds what earlier runs left, and its threads may be
/// changing it now: every directory is reached through [`Root`] (never through a link),
/// and each file is written under a temporary name in its directory, then renamed over
/// its path. An existing directory on the way is used; a file already at the path is
/// replaced (staging the same path again puts the stored file back); a link or file where
/// a directory is needed, or a directory at the path, is a conflict.
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
    let root = Root::open(workspace).map_err(|source| StageError::Io {
        path: ".".into(),
        source,
    })?;
    let owner = std::fs::metadata(workspace).map_err(|source| StageError::Io {
        path: ".".into(),
        source,
    })?;
    let owner = Owner {
        uid: owner.uid(),
        gid: owner.gid(),
    };
    // Every path is checked before anything is written: a request refused for one of its
    // files leaves the workspace as it was (unless the program changes it meanwhile).
    for input in inputs {
        check_path(&root, &input.path)?;
    }
    for input in inputs {
        let path = &input.path;
        let io_err = |source: io::Error| stage_error(path, source);
        let got = store.get(&input.file_id, tenant, None).await;
        let (_, mut reader) = got.map_err(|e| match e {
            StoreError::NotFound(_) => StageError::NotFound {
                file_id: input.file_id.clone(),
                path: path.clone(),
            },
            source => StageError::Store {
                path: path.clone(),
                source,
            },
        })?;
        // Down to the file's directory from the workspace's descriptor, one directory at a
        // time: each made when missing (and given to the workspace's owner), used when
        // there (an earlier run's, or the program's) if it is a directory, not a link.
        let (dirs, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        let mut parent = root.dir("").map_err(io_err)?;
        let mut dir = String::new();
        for part in dirs.split('/').filter(|part| !part.is_empty()) {
            if !dir.is_empty() {
                dir.push('/');
            }
            dir.push_str(part);
            let made = match nix::sys::stat::mkdirat(&parent, part, Mode::from_bits_truncate(0o755))
            {
                Ok(()) => true,
                Err(nix::errno::Errno::EEXIST) => false,
                Err(e) => return Err(io_err(e.into())),
            };
            parent = open_dir_at(&parent, part).map_err(io_err)?;
            if made {
                owner.apply(&parent).map_err(io_err)?;
            }
            staged.dirs.insert(dir.clone());
        }
        // A directory at the path was refused by the check; one the program put there since
        // makes the rename fail (`EISDIR`), and the temporary file goes.
        let temporary = format!(".snakecage-staging-{}", uuid::Uuid::new_v4().simple());
        let file = openat(
            &parent,
            temporary.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| io_err(e.into()))?;
        let written = async {
            let mut file = tokio::fs::File::from_std(std::fs::File::from(file));
            tokio::io::copy(&mut reader, &mut file).await?;
            let file = file.into_std().await;
            owner.apply(&file)?;
            nix::fcntl::renameat(&parent, temporary.as_str(), &parent, name)?;
            file.metadata()
        }
        .await;
        let meta = match written {
            Ok(meta) => meta,
            Err(e) => {
                let _ =
                    nix::unistd::unlinkat(&parent, temporary.as_str(), UnlinkatFlags::NoRemoveDir);
                return Err(io_err(e));
            }
        };
        staged.files.insert(path.clone(), Fingerprint::of(&meta));
    }
    Ok(staged)
}

/// Whether `path` could be staged as the workspace is now: each directory on its way is
/// missing or a directory (not a link, not a file), and no directory is at the path.
fn check_path(root: &Root, path: &str) -> Result<(), StageError> {
    let mut dir = root.dir("").map_err(|e| stage_error(path, e))?;
    let mut parts = path.split('/').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            let st = nix::sys::stat::fstatat(&dir, part, AtFlags::AT_SYMLINK_NOFOLLOW);
            if st.is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR) {
                return Err(stage_error(
                    path,
                    io::Error::from_raw_os_error(libc::EISDIR),
                ));
            }
            return Ok(());
        }
        dir = match open_dir_at(&dir, part) {
            Ok(next) => next,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(stage_error(path, e)),
        };
    }
    Ok(())
}

/// What an I/O error while staging `path` tells the caller.
fn stage_error(path: &str, source: io::Error) -> StageError {
    let conflict = |reason: &str| StageError::Conflict {
        path: path.to_owned(),
        reason: reason.into(),
    };
    match source.raw_os_error() {
        Some(libc::ENOTDIR | libc::ELOOP) => conflict(
            "a file or a symbolic link is in the way where a directory is needed (staging \
             never writes through a link)",
        ),
        Some(libc::EISDIR) => conflict("a directory is in the way"),
        // Only the job removes what staging made or found (its threads run on in a session).
        Some(libc::ENOENT) => conflict(
            "the workspace changed while the file was staged: a directory on its way was \
             removed (by the program's own threads)",
        ),
        Some(libc::ENAMETOOLONG) => StageError::NameTooLong {
            path: path.to_owned(),
        },
        Some(libc::ENOSPC | libc::EDQUOT) => StageError::NoSpace {
            path: path.to_owned(),
        },
        _ => StageError::Io {
            path: path.to_owned(),
            source,
        },
    }
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

    /// Whether the entry whose name is not UTF-8 (its [`odd_key`]) is in the baseline
    /// unchanged.
    pub(super) fn has_unchanged_odd(&self, key: &str, meta: &std::fs::Metadata) -> bool {
        self.others.get(key) == Some(&Fingerprint::of(meta))
    }

    /// Whether the entry at `path` is in the baseline unchanged, as whatever kind it is.
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
    let Ok(top) = Root::open(workspace).and_then(|root| root.dir("")) else {
        return Staged::default();
    };
    tokio::task::spawn_blocking(move || {
        let mut staged = Staged::default();
        let mut footprint = Footprint::default();
        let mut seen = 0usize;
        // As the scan goes: each directory opened from its parent's descriptor, no deeper
        // than it looks, names that are not UTF-8 kept apart and not descended.
        let mut pending = vec![(String::new(), Arc::new(top))];
        while let Some((prefix, dir)) = pending.pop() {
            let left = max_entries.saturating_sub(seen).saturating_add(1);
            let entries = match list(&dir, left) {
                Ok(entries) => entries,
                Err(e) => {
                    footprint.unreadable(&e);
                    continue;
                }
            };
            for (name, meta) in entries {
                seen += 1;
                if seen > max_entries {
                    footprint.whole = false;
                    staged.footprint = Some(footprint);
                    return staged;
                }
                let meta = match meta {
                    Ok(meta) => meta,
                    Err(e) => {
                        footprint.unreadable(&e);
                        continue;
                    }
                };
                footprint.add(&meta);
                let Some(utf8) = name.to_str() else {
                    staged
                        .others
                        .insert(odd_key(&prefix, &name), Fingerprint::of(&meta));
                    continue;
                };
                let rel = if prefix.is_empty() {
                    utf8.to_owned()
                } else {
                    format!("{prefix}/{utf8}")
                };
                if meta.file_type().is_dir() {
                    staged.dirs.insert(rel.clone());
                    if rel.len() > MAX_PATH_BYTES || rel.split('/').count() > MAX_DEPTH {
                        footprint.whole = false;
                        continue;
                    }
                    match open_dir_at(dir.as_ref(), utf8) {
                        Ok(fd) => pending.push((rel, Arc::new(fd))),
                        Err(e) => footprint.unreadable(&e),
                    }
                } else if meta.file_type().is_file() {
                    staged.files.insert(rel, Fingerprint::of(&meta));
                } else {
                    staged.others.insert(rel, Fingerprint::of(&meta));
                }
            }
        }
        staged.footprint = Some(footprint);
        staged
    })
    .await
    .unwrap_or_default()
}

/// The baseline's key of an entry whose name is not UTF-8: a NUL (which no name holds)
/// and the name's bytes escaped, so it collides with no UTF-8 path (`\xff.bin` and
/// `\u{fffd}.bin` are two entries) nor with another such name.
pub(super) fn odd_key(prefix: &str, name: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    format!("\0{prefix}/{}", name.as_bytes().escape_ascii())
}

struct Owner {
    uid: u32,
    gid: u32,
}

impl Owner {
    /// Gives what `fd` is (opened, not named: nothing renamed meanwhile is changed) to
    /// the workspace's owner.
    fn apply(&self, fd: &impl AsFd) -> io::Result<()> {
        // SAFETY: geteuid/getegid only read the process's credentials.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if (self.uid, self.gid) == (euid, egid) {
            return Ok(());
        }
        nix::unistd::fchown(
            fd,
            Some(nix::unistd::Uid::from_raw(self.uid)),
            Some(nix::unistd::Gid::from_raw(self.gid)),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::FileOwner;
    use crate::files::local::{LocalStore, LocalStoreSettings};

    async fn stored(store: &LocalStore, text: &str) -> String {
        let mut body = text.as_bytes();
        store
            .put(FileOwner::default(), "données.csv", &mut body)
            .await
            .unwrap()
            .file_id
    }

    fn input(path: &str, file_id: &str) -> StageInput {
        StageInput {
            path: path.into(),
            file_id: file_id.into(),
        }
    }

    /// What a program left in a session's workspace: existing directories are used, a
    /// file at the path is replaced, and nothing is ever written through a link.
    #[tokio::test]
    async fn staging_uses_what_is_there_and_never_writes_through_a_link() {
        let store_dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(LocalStoreSettings {
            dir: store_dir.path().to_path_buf(),
            max_file_bytes: 1 << 20,
            bounds: crate::files::StoreBounds::default(),
            charge: crate::files::Charge::default(),
            ttl: None,
        })
        .unwrap();
        let first = stored(&store, "a,b\n1,2\n").await;
        let second = stored(&store, "ü\n").await;
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("keep.txt"), "the host's").unwrap();
        let ws = tempfile::tempdir().unwrap();
        let at = |p: &str| ws.path().join(p);
        let stage_one = |path: &str, id: &str| {
            let inputs = [input(path, id)];
            let store = &store;
            let ws = ws.path().to_path_buf();
            async move { stage(store, None, &ws, &inputs).await }
        };

        stage_one("in/sales.csv", &first).await.unwrap();
        // The program changed it; staging the same path again puts the stored file back,
        // and a second file goes into the directory that is there.
        std::fs::write(at("in/sales.csv"), "changed").unwrap();
        let again = stage_one("in/sales.csv", &first).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(at("in/sales.csv")).unwrap(),
            "a,b\n1,2\n"
        );
        let meta = std::fs::symlink_metadata(at("in/sales.csv")).unwrap();
        assert_eq!(again.files["in/sales.csv"], Fingerprint::of(&meta));
        stage_one("in/ü.txt", &second).await.unwrap();
        assert_eq!(std::fs::read_to_string(at("in/ü.txt")).unwrap(), "ü\n");

        // A link where a directory is needed: refused, nothing written outside.
        std::os::unix::fs::symlink(host.path(), at("out")).unwrap();
        let err = stage_one("out/x.csv", &first).await.unwrap_err();
        assert!(
            matches!(&err, StageError::Conflict { reason, .. } if reason.contains("symbolic link")),
            "{err}"
        );
        assert!(!host.path().join("x.csv").exists());
        // A file where a directory is needed, a directory at the path: refused.
        std::fs::write(at("plain"), "x").unwrap();
        let err = stage_one("plain/x.csv", &first).await.unwrap_err();
        assert!(matches!(err, StageError::Conflict { .. }), "{err}");
        let err = stage_one("in", &first).await.unwrap_err();
        assert!(
            matches!(&err, StageError::Conflict { reason, .. } if reason == "a directory is in the way"),
            "{err}"
        );
        // A link at the path itself is replaced by the file, never written through.
        std::os::unix::fs::symlink(host.path().join("keep.txt"), at("in/link.csv")).unwrap();
        stage_one("in/link.csv", &second).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(host.path().join("keep.txt")).unwrap(),
            "the host's"
        );
        assert!(
            std::fs::symlink_metadata(at("in/link.csv"))
                .unwrap()
                .is_file()
        );
        // No temporary file is left behind.
        let mut names: Vec<String> = std::fs::read_dir(at("in"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["link.csv", "sales.csv", "ü.txt"]);
    }
}
