//! Collection: after a run, every new or changed regular file of the workspace stored
//! (and every new directory listed), by a bounded scan that never follows a link.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::future::Either;
use serde::Serialize;

use nix::fcntl::OFlag;

use super::MAX_PATH_BYTES;
use super::beneath::{MAX_DEPTH, Root, list, open_dir_at};
use super::stage::{Fingerprint, Staged, odd_key};
use crate::files::{
    Charge, FileMeta, FileOwner, FileStore, SharedStore, StoreError, UploadSize, size_text,
};

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
    /// Files stored (`workspace.max_files`).
    pub max_files: usize,
}

#[derive(Debug, Default)]
pub struct Collected {
    pub files: Vec<WorkspaceFile>,
    pub skipped: Vec<SkippedFile>,
}

/// Stores every new or changed regular file of `workspace` and lists new directories.
/// The job may still be changing it (a session's threads go on between runs): every path
/// is opened through [`Root`], never through a link, so what it changes meanwhile can only
/// make an entry skipped, never lead outside. Dropped before it ends (its client left),
/// it deletes what it stored: no answer will name those files.
pub async fn collect(
    shared: &SharedStore,
    owner: FileOwner<'_>,
    workspace: &Path,
    staged: &Staged,
    limits: CollectLimits,
) -> Collected {
    // Most runs leave nothing: one directory read, here, answers that without sending the
    // scan to a blocking thread and back (two wake-ups, a measurable part of a short run).
    if staged.is_empty() && is_empty_dir(workspace) {
        return Collected::default();
    }
    let root = match Root::open(workspace) {
        Ok(root) => Arc::new(root),
        Err(e) => {
            return Collected {
                files: Vec::new(),
                skipped: vec![SkippedFile {
                    path: ".".into(),
                    reason: format!("could not be listed: {e}"),
                }],
            };
        }
    };
    let scan = {
        let root = root.clone();
        let staged_for_scan = staged.clone();
        tokio::task::spawn_blocking(move || scan(&root, &staged_for_scan, limits))
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "workspace scan panicked");
                Scan::default()
            })
    };
    // Files are stored a few at a time: a local store's write waits for two fsyncs, and
    // concurrent ones share the filesystem's journal commits (an S3 store's, its round
    // trips). Results are taken in scan order, and the budget is decided as if one at a
    // time: a file that fits even if every store in flight succeeds is sent at once; one
    // that may not fit waits for them, and only a stored file counts.
    let mut out = Collected {
        files: Vec::new(),
        skipped: scan.skipped,
    };
    let undo = Undo::new(shared, owner);
    let mut in_flight = futures_util::stream::FuturesOrdered::new();
    let mut aliases = scan.aliases;
    // Stored so far, and sent to the store; files, then bytes.
    let (mut stored, mut sent) = ((0usize, 0u64), (0usize, 0u64));
    for entry in scan.entries {
        let (path, len) = match entry {
            Found::Directory(path) => {
                let done = Done {
                    path,
                    len: 0,
                    names: Vec::new(),
                    stored: None,
                };
                in_flight.push_back(Either::Left(std::future::ready(done)));
                continue;
            }
            Found::File { path, len } => (path, len),
        };
        let names = aliases.remove(&path).unwrap_or_default();
        while stored.1 + sent.1 + len > limits.max_total_bytes
            || stored.0 + sent.0 >= limits.max_files
            || in_flight.len() >= STORE_CONCURRENCY
        {
            let Some(done) = in_flight.next().await else {
                break;
            };
            if done.stored.is_some() {
                sent.0 -= 1;
                sent.1 -= done.len;
            }
            let (files, bytes) = record(&mut out, done);
            stored.0 += files;
            stored.1 += bytes;
        }
        let over = if stored.0 >= limits.max_files {
            Some(format!(
                "the run left more than {} files to store (workspace.max_files); the first {} \
                 in path order were stored",
                limits.max_files, limits.max_files
            ))
        } else if stored.1 + len > limits.max_total_bytes {
            Some(format!(
                "the run's files exceed the workspace budget of {} MB",
                limits.max_total_bytes >> 20
            ))
        } else {
            None
        };
        if let Some(reason) = over {
            for path in std::iter::once(path).chain(names) {
                out.skipped.push(SkippedFile {
                    reason: reason.clone(),
                    path,
                });
            }
            continue;
        }
        sent.0 += 1;
        sent.1 += len;
        let stored = undo.store(root.clone(), path.clone(), len);
        in_flight.push_back(Either::Right(async move {
            Done {
                path,
                len,
                names,
                stored: Some(stored.await),
            }
        }));
    }
    while let Some(done) = in_flight.next().await {
        record(&mut out, done);
    }
    undo.keep();
    out
}

/// The stores of a collection, each on a task of its own, so that none is dropped
/// halfway (a local store's temporary file and reservation, an S3 multipart upload): a
/// collection dropped before it ends (its client left) lets them finish and deletes what
/// they stored, in the background. Otherwise some of the run's files would stay stored,
/// charged to its key and named by no answer, and partial copies would stay on disk.
struct Undo {
    shared: Arc<Undone>,
    kept: bool,
}

struct Undone {
    store: SharedStore,
    owner: Option<String>,
    quota_bytes: Option<u64>,
    /// The ids stored so far, and whether the collection was dropped.
    state: std::sync::Mutex<(Vec<String>, bool)>,
}

impl Undone {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<String>, bool)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn delete(&self, ids: Vec<String>) {
        for file_id in ids {
            if let Err(e) = self.store.delete(&file_id, self.owner.as_deref()).await {
                tracing::warn!(%file_id, error = %e, "could not delete a file of a dropped collection");
            }
        }
    }
}

impl Undo {
    fn new(store: &SharedStore, owner: FileOwner<'_>) -> Self {
        Self {
            shared: Arc::new(Undone {
                store: store.clone(),
                owner: owner.name.map(str::to_owned),
                quota_bytes: owner.quota_bytes,
                state: std::sync::Mutex::default(),
            }),
            kept: false,
        }
    }

    /// Stores the file at `path` on a task of its own; its answer.
    fn store(
        &self,
        root: Arc<Root>,
        path: String,
        len: u64,
    ) -> impl Future<Output = Result<FileMeta, Unstored>> + use<> {
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            let owner = FileOwner {
                name: shared.owner.as_deref(),
                quota_bytes: shared.quota_bytes,
            };
            let result = store_one(shared.store.as_ref(), owner, &root, &path, len).await;
            if let Ok(meta) = &result {
                let dropped = {
                    let mut state = shared.lock();
                    state.0.push(meta.file_id.clone());
                    state.1
                };
                if dropped {
                    shared.delete(vec![meta.file_id.clone()]).await;
                }
            }
            result
        });
        async move {
            task.await.unwrap_or_else(|e| {
                Err(Unstored::Store(StoreError::Io {
                    doing: "storing",
                    path: "a workspace file".into(),
                    source: io::Error::other(e.to_string()),
                }))
            })
        }
    }

    /// The collection ended: its answer names every file it stored.
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let stored = {
            let mut state = self.shared.lock();
            state.1 = true;
            std::mem::take(&mut state.0)
        };
        if stored.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        tracing::info!(
            files = stored.len(),
            "a run's file collection was dropped (its client left): deleting the files it stored"
        );
        let shared = self.shared.clone();
        runtime.spawn(async move { shared.delete(stored).await });
    }
}

/// An entry whose turn came: a directory (`stored` `None`), or a file with the store's
/// answer and the other names it has in the workspace (hard links).
struct Done {
    path: String,
    len: u64,
    names: Vec<String>,
    stored: Option<Result<FileMeta, Unstored>>,
}

/// Adds a finished entry to `out`; returns the files and bytes stored.
fn record(out: &mut Collected, done: Done) -> (usize, u64) {
    let Done {
        path,
        len,
        names,
        stored,
    } = done;
    match stored {
        None => {
            out.files.push(WorkspaceFile {
                path,
                kind: EntryKind::Directory,
                file_id: None,
                size_bytes: None,
                mime_type: None,
            });
            (0, 0)
        }
        Some(Ok(meta)) => {
            let size = meta.size_bytes;
            // Every name of the file, each with the one stored copy's id.
            for path in std::iter::once(path).chain(names) {
                out.files.push(WorkspaceFile {
                    path,
                    kind: EntryKind::File,
                    file_id: Some(meta.file_id.clone()),
                    size_bytes: Some(size),
                    mime_type: Some(meta.mime_type.clone()),
                });
            }
            (1, size)
        }
        Some(Err(unstored)) => {
            let reason = match unstored {
                // The worker is gone: the file's size on disk is its whole size.
                Unstored::Store(e) => skip_reason(&path, &e.with_whole_size(len)),
                Unstored::Sparse { data } => format!(
                    "a sparse file: {} long, of which only {} is data and the rest holes; a \
                     file more than half holes (and over {} of them) is not stored, as it \
                     would be stored and counted at its whole length",
                    size_text(len),
                    size_text(data),
                    size_text(SPARSE_HOLES_BYTES)
                ),
            };
            for path in std::iter::once(path).chain(names) {
                out.skipped.push(SkippedFile {
                    path,
                    reason: reason.clone(),
                });
            }
            (0, 0)
        }
    }
}

/// Why a file was not stored: the store refused it, or it is sparse.
#[derive(Debug)]
enum Unstored {
    Store(StoreError),
    /// Only `data` bytes of it are not holes.
    Sparse {
        data: u64,
    },
}

impl From<StoreError> for Unstored {
    fn from(e: StoreError) -> Self {
        Unstored::Store(e)
    }
}

/// The holes a file may have and still be stored (when it is more than half holes).
pub const SPARSE_HOLES_BYTES: u64 = 1 << 20;

/// Whether a file of `len` bytes with `data` bytes that are not holes is too sparse to
/// store: more than half holes, and more than [`SPARSE_HOLES_BYTES`] of them.
fn too_sparse(len: u64, data: u64) -> bool {
    let holes = len.saturating_sub(data);
    holes > SPARSE_HOLES_BYTES && holes > len / 2
}

/// The bytes of `file` (of `len` bytes) that are data, not holes, as `SEEK_DATA` and
/// `SEEK_HOLE` find them; `None` when the file system cannot say or the file has too many
/// extents to walk.
fn data_bytes(file: &std::fs::File, len: u64) -> Option<u64> {
    use nix::unistd::{Whence, lseek};
    const MAX_EXTENTS: usize = 4096;
    let (mut data, mut pos) = (0u64, 0i64);
    for _ in 0..MAX_EXTENTS {
        if pos as u64 >= len {
            return Some(data);
        }
        let start = match lseek(file, pos, Whence::SeekData) {
            Ok(start) => start,
            // No data past `pos`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => return Some(data),
            Err(_) => return None,
        };
        let end = lseek(file, start, Whence::SeekHole).ok()?;
        data += (end.min(len as i64) - start).max(0) as u64;
        pos = end;
    }
    None
}

/// Whose quota refused a file: `whose` (`file storage`, `the API key`), the quota's name
/// (`quota`, `own quota`) and the setting that sets it.
type QuotaName<'a> = (&'a str, &'a str, &'a str);

/// Why a quota refused a file: larger than the whole quota (no deletion makes room), or
/// past what is left of it. Sizes are charges (a file's blocks and one more).
fn quota_reason(
    (whose, quota_name, setting): QuotaName<'_>,
    quota_bytes: u64,
    stored_bytes: u64,
    upload: UploadSize,
    charge: Charge,
) -> String {
    if upload.larger_than(quota_bytes, charge) {
        format!(
            "larger ({}) than the whole {quota_name} of {whose}, {} ({setting})",
            size_text(charge.of(upload.bytes())),
            size_text(quota_bytes)
        )
    } else {
        format!(
            "it would take {whose} past its {quota_name} of {} ({setting}; {} used)",
            size_text(quota_bytes),
            size_text(stored_bytes)
        )
    }
}

/// How many workspace files are stored at once.
const STORE_CONCURRENCY: usize = 16;

/// Why a file the store refused is skipped, in words for the caller.
fn skip_reason(path: &str, e: &StoreError) -> String {
    match e {
        StoreError::TooLarge { max_bytes } => {
            format!(
                "larger than the maximum file size of {} MB",
                max_bytes >> 20
            )
        }
        StoreError::QuotaExceeded {
            quota_bytes,
            stored_bytes,
            upload,
            charge,
            holders,
        } => {
            let reason = quota_reason(
                ("file storage", "quota", "files.quota_mb"),
                *quota_bytes,
                *stored_bytes,
                *upload,
                *charge,
            );
            match holders {
                Some(h) => format!("{reason}; {}", h.describe()),
                None => reason,
            }
        }
        StoreError::OwnerQuotaExceeded {
            quota_bytes,
            stored_bytes,
            upload,
            charge,
            own,
            ..
        } => quota_reason(
            if *own {
                ("the API key", "own quota", "max_stored_mb")
            } else {
                (
                    "the API key",
                    "own share of the store",
                    "files.key_share_percent",
                )
            },
            *quota_bytes,
            *stored_bytes,
            *upload,
            *charge,
        ),
        StoreError::TooManyFiles {
            owner: Some(_),
            max_files,
        } => format!(
            "the API key holds {max_files} stored files, the most a key may hold \
             (files.max_files_per_key)"
        ),
        StoreError::TooManyFiles {
            owner: None,
            max_files,
        } => format!(
            "the file store holds {max_files} files, the most it may hold (files.max_files)"
        ),
        e if e.is_out_of_space() => {
            tracing::warn!(path, error = %e, "the file store has no space left");
            "the file store has no space left (full or read-only)".into()
        }
        StoreError::Unavailable { .. } => {
            tracing::warn!(path, error = %e, "storing a workspace file failed");
            format!("could not be stored: {e}")
        }
        _ => {
            tracing::error!(path, error = %e, "storing a workspace file failed");
            "could not be stored (internal error)".into()
        }
    }
}

async fn store_one(
    store: &dyn FileStore,
    owner: FileOwner<'_>,
    root: &Root,
    path: &str,
    len: u64,
) -> Result<FileMeta, Unstored> {
    let io_err = |source| StoreError::Io {
        doing: "reading",
        path: path.into(),
        source,
    };
    // The scan saw a regular file; never read through a link put in its place or on its
    // way (`O_NONBLOCK`: nor wait on a FIFO).
    let file = root
        .open_file(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK)
        .map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(io_err(io::Error::other("no longer a regular file")).into());
    }
    // Blocks allocated say whether it may have holes; SEEK_DATA says whether it has (a
    // file system that compresses allocates fewer blocks for data too).
    let allocated = meta.blocks().saturating_mul(512);
    if too_sparse(len, allocated)
        && let Some(data) = data_bytes(&file, len).or(Some(allocated))
        && too_sparse(len, data)
    {
        return Err(Unstored::Sparse { data });
    }
    // What the scan measured, no more: the budget was decided on it, and a file the
    // program is still writing cannot take more of it (its first `len` bytes are stored).
    let mut file = tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(file), len);
    let name = path.rsplit('/').next().unwrap_or(path);
    Ok(store.put(owner, name, &mut file).await?)
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
    /// A file with several names (hard links): its first name in scan order (its entry)
    /// and the others, which have no entry of their own. It is stored once.
    aliases: HashMap<String, Vec<String>>,
}

/// Depth-first pre-order, names sorted, a directory before its contents; never follows a
/// link.
/// Whether `dir` holds no entry at all; an unreadable one is not empty (the scan reports it).
fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

fn scan(root: &Root, staged: &Staged, limits: CollectLimits) -> Scan {
    /// An entry of the directory `parent` (open), and a directory to read: each opened
    /// from its parent's descriptor when its turn comes, so the scan holds open only the
    /// directories on its current path (at most [`MAX_DEPTH`]).
    enum Item {
        Entry(String, std::fs::Metadata, Arc<OwnedFd>),
        Expand(String, Arc<OwnedFd>),
    }
    let mut out = Scan::default();
    let mut seen = 0usize;
    // The first name of each file with several (by device and inode).
    let mut first_names: HashMap<(u64, u64), String> = HashMap::new();
    // Past `max_entries` no directory is read any more; the entries read until then are
    // still handled (a flat directory of too many files keeps the ones read).
    let mut full = false;
    let top = match root.dir("") {
        Ok(fd) => Arc::new(fd),
        Err(e) => {
            out.skipped.push(SkippedFile {
                path: ".".into(),
                reason: format!("could not be listed: {e}"),
            });
            return out;
        }
    };
    let mut stack = vec![Item::Expand(String::new(), top)];
    while let Some(item) = stack.pop() {
        let (prefix, dir) = match item {
            Item::Expand(..) if full => continue,
            Item::Expand(prefix, dir) => (prefix, dir),
            Item::Entry(rel, meta, parent) => {
                let kind = meta.file_type();
                if kind.is_dir() {
                    if !staged.dirs.contains(&rel) {
                        out.entries.push(Found::Directory(rel.clone()));
                    }
                    if rel.split('/').count() > MAX_DEPTH {
                        out.skipped.push(SkippedFile {
                            reason: format!(
                                "deeper than {MAX_DEPTH} directories; what it holds was not looked at"
                            ),
                            path: rel,
                        });
                        continue;
                    }
                    let name = rel.rsplit('/').next().unwrap_or(&rel);
                    match open_dir_at(parent.as_ref(), name) {
                        Ok(fd) => stack.push(Item::Expand(rel, Arc::new(fd))),
                        Err(e) => out.skipped.push(SkippedFile {
                            reason: format!("could not be listed: {e}"),
                            path: rel,
                        }),
                    }
                } else if kind.is_file() {
                    if staged.files.get(&rel) != Some(&Fingerprint::of(&meta)) {
                        if meta.nlink() > 1 {
                            match first_names.entry((meta.dev(), meta.ino())) {
                                Entry::Occupied(first) => {
                                    out.aliases
                                        .entry(first.get().clone())
                                        .or_default()
                                        .push(rel);
                                    continue;
                                }
                                Entry::Vacant(v) => drop(v.insert(rel.clone())),
                            }
                        }
                        out.entries.push(Found::File {
                            path: rel,
                            len: meta.len(),
                        });
                    }
                } else if !staged.has_unchanged(&rel, &meta) {
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
        // One more than the budget left: reading it says the budget is passed.
        let left = limits.max_entries.saturating_sub(seen).saturating_add(1);
        let entries = match list(&dir, left) {
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
        for (name, meta) in entries {
            seen += 1;
            if seen > limits.max_entries {
                out.skipped.push(SkippedFile {
                    path: if prefix.is_empty() {
                        ".".into()
                    } else {
                        prefix.clone()
                    },
                    reason: format!(
                        "the workspace has more than {} entries; the rest was not looked at",
                        limits.max_entries
                    ),
                });
                full = true;
                break;
            }
            let Some(name) = name.to_str() else {
                let path = join(&prefix, &name.to_string_lossy());
                let key = odd_key(&prefix, &name);
                let known = meta
                    .as_ref()
                    .is_ok_and(|meta| staged.has_unchanged_odd(&key, meta));
                if !known {
                    out.skipped.push(SkippedFile {
                        path,
                        reason: "the name is not valid UTF-8".into(),
                    });
                }
                continue;
            };
            let rel = join(&prefix, name);
            // Reached one directory at a time, a path has no length limit here; one that
            // could not be staged back (or used by most tools) is not stored, nor descended.
            if rel.len() > MAX_PATH_BYTES {
                out.skipped.push(SkippedFile {
                    reason: format!(
                        "the path is too long: {} bytes, over the {MAX_PATH_BYTES} a staged path may \
                         have (PATH_MAX)",
                        rel.len()
                    ),
                    path: rel,
                });
                continue;
            }
            // As lstat gives it: a link is reported as a link.
            match meta {
                Ok(meta) => children.push(Item::Entry(rel, meta, dir.clone())),
                Err(e) => out.skipped.push(SkippedFile {
                    path: rel,
                    reason: format!("could not be read: {e}"),
                }),
            }
        }
        let name_of = |item: &Item| match item {
            Item::Entry(rel, ..) | Item::Expand(rel, _) => rel.clone(),
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

    fn limits() -> CollectLimits {
        CollectLimits {
            max_entries: 100,
            max_total_bytes: 1 << 20,
            max_files: 1000,
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
        let found = scan(&Root::open(root).unwrap(), &Staged::default(), limits());
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

    /// Stores run concurrently, yet the answer is the one a store at a time gives: scan
    /// order, and a budget where only stored files count.
    #[tokio::test]
    async fn files_stored_together_keep_scan_order_and_the_budget_of_one_at_a_time() {
        use tokio::io::AsyncReadExt;

        let ws = tempfile::tempdir().unwrap();
        let root = ws.path();
        let store_dir = tempfile::tempdir().unwrap();
        let store =
            crate::files::local::LocalStore::open(crate::files::local::LocalStoreSettings {
                dir: store_dir.path().to_path_buf(),
                max_file_bytes: 200,
                bounds: crate::files::StoreBounds::default(),
                charge: crate::files::Charge::default(),
                ttl: None,
            })
            .unwrap();
        let write =
            |p: &str, len: usize| std::fs::write(root.join(p), "é".repeat(len / 2)).unwrap();
        write("a_trop_gros.bin", 300); // refused by the store: counts nothing
        std::fs::create_dir(root.join("b_dossier")).unwrap();
        write("b_dossier/c.txt", 150);
        write("d.txt", 150);
        write("e.txt", 150); // 450: fits only because the refused file does not count
        write("f.txt", 100); // 550: over the budget
        write("g.txt", 50); // 500: fits exactly
        for i in 0..40 {
            write(&format!("h{i:02}_vide_ü"), 0);
        }
        let limits = CollectLimits {
            max_entries: 1000,
            max_total_bytes: 500,
            max_files: 1000,
        };
        let owner = FileOwner::default();
        let store: SharedStore = Arc::new(store);
        let got = collect(&store, owner, root, &Staged::default(), limits).await;

        let mut expected: Vec<String> = ["b_dossier", "b_dossier/c.txt", "d.txt", "e.txt", "g.txt"]
            .map(str::to_owned)
            .into();
        expected.extend((0..40).map(|i| format!("h{i:02}_vide_ü")));
        let paths: Vec<&str> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, expected);
        assert_eq!(got.files[0].kind, EntryKind::Directory);
        let skipped: Vec<(&str, &str)> = got
            .skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert_eq!(skipped[0].0, "a_trop_gros.bin");
        assert!(skipped[0].1.contains("maximum file size"), "{skipped:?}");
        assert_eq!(skipped[1].0, "f.txt");
        assert!(skipped[1].1.contains("workspace budget"), "{skipped:?}");
        // Each id holds its own file's bytes.
        for file in got.files.iter().filter(|f| f.kind == EntryKind::File) {
            let (meta, mut bytes) = store
                .get(file.file_id.as_deref().unwrap(), None, None)
                .await
                .unwrap();
            let mut stored = Vec::new();
            bytes.read_to_end(&mut stored).await.unwrap();
            assert_eq!(
                stored,
                std::fs::read(root.join(&file.path)).unwrap(),
                "{}",
                file.path
            );
            assert_eq!(Some(meta.size_bytes), file.size_bytes);
        }
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
        let found = scan(&Root::open(root).unwrap(), &staged, limits());
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
            &Root::open(root).unwrap(),
            &staged,
            CollectLimits {
                max_entries: 10,
                max_total_bytes: 1 << 20,
                max_files: 1000,
            },
        );
        // The entries read before the limit are kept (the staged `in` may be one of them).
        assert!((9..=10).contains(&found.entries.len()), "{found:?}");
        assert!(found.skipped[0].reason.contains("more than 10 entries"));
    }

    fn local_store(dir: &Path) -> crate::files::local::LocalStore {
        crate::files::local::LocalStore::open(crate::files::local::LocalStoreSettings {
            dir: dir.to_path_buf(),
            max_file_bytes: 1 << 20,
            bounds: crate::files::StoreBounds::default(),
            charge: crate::files::Charge::default(),
            ttl: None,
        })
        .unwrap()
    }

    /// The job changes its workspace while it is collected (a session's thread between
    /// runs): a directory the scan saw, made a link to a host directory before its file is
    /// read, is not read through, and the host's file never reaches the store.
    #[tokio::test]
    async fn a_directory_swapped_for_a_link_after_the_scan_is_not_read_through() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret.txt"), "the host's").unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        std::fs::write(ws.path().join("d/secret.txt"), "mine").unwrap();
        let root = Root::open(ws.path()).unwrap();
        let found = scan(&root, &Staged::default(), limits());
        assert!(
            found.entries.contains(&Found::File {
                path: "d/secret.txt".into(),
                len: 4
            }),
            "{:?}",
            found.entries
        );
        std::fs::remove_dir_all(ws.path().join("d")).unwrap();
        std::os::unix::fs::symlink(host.path(), ws.path().join("d")).unwrap();

        let store_dir = tempfile::tempdir().unwrap();
        let store = local_store(store_dir.path());
        let got = store_one(&store, FileOwner::default(), &root, "d/secret.txt", 4).await;
        let Err(Unstored::Store(StoreError::Io { source, .. })) = got else {
            panic!("read through the link: {got:?}");
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOTDIR));
        // The last component swapped for a link to the host's file: not read either.
        std::fs::remove_file(ws.path().join("d")).unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        std::os::unix::fs::symlink(
            host.path().join("secret.txt"),
            ws.path().join("d/secret.txt"),
        )
        .unwrap();
        let got = store_one(&store, FileOwner::default(), &root, "d/secret.txt", 4).await;
        assert!(
            matches!(got, Err(Unstored::Store(StoreError::Io { .. }))),
            "{got:?}"
        );
        assert!(store.list_all().await.unwrap().is_empty());
    }

    /// A name that is not UTF-8 and the UTF-8 name it reads as lossily are two entries of
    /// a session's baseline: neither is reported again while neither changes.
    #[tokio::test]
    async fn a_name_that_is_not_utf8_does_not_shadow_its_lossy_twin() {
        use std::os::unix::ffi::OsStrExt;
        let ws = tempfile::tempdir().unwrap();
        let odd = std::ffi::OsStr::from_bytes(b"\xff.bin");
        std::fs::write(ws.path().join(odd), "odd").unwrap();
        std::fs::write(ws.path().join("\u{fffd}.bin"), "twin").unwrap();
        let baseline = super::super::snapshot(ws.path(), 100).await;
        let found = scan(&Root::open(ws.path()).unwrap(), &baseline, limits());
        assert!(found.entries.is_empty(), "{:?}", found.entries);
        assert!(found.skipped.is_empty(), "{:?}", found.skipped);
    }

    /// A chain of directories deeper than the scan looks: it stops at [`MAX_DEPTH`], says
    /// so once, and the session's snapshot of it stays as bounded.
    #[tokio::test]
    async fn the_scan_and_the_snapshot_stop_at_their_depth() {
        let ws = tempfile::tempdir().unwrap();
        let deep = vec!["d"; MAX_DEPTH + 20].join("/");
        std::fs::create_dir_all(ws.path().join(&deep)).unwrap();
        let limits = CollectLimits {
            max_entries: 1000,
            max_total_bytes: 1 << 20,
            max_files: 1000,
        };
        let found = scan(&Root::open(ws.path()).unwrap(), &Staged::default(), limits);
        let dirs = found
            .entries
            .iter()
            .filter(|e| matches!(e, Found::Directory(_)))
            .count();
        assert_eq!(dirs, MAX_DEPTH + 1, "{:?}", found.skipped);
        assert_eq!(found.skipped.len(), 1, "{:?}", found.skipped);
        assert!(
            found.skipped[0]
                .reason
                .contains("deeper than 128 directories")
        );
        let baseline = super::super::snapshot(ws.path(), 1000).await;
        assert_eq!(baseline.dirs.len(), MAX_DEPTH + 1);
    }

    /// A file that grows after the scan measured it is stored at the length the budget was
    /// decided on.
    #[tokio::test]
    async fn a_file_growing_during_collection_is_stored_as_measured() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("wächst.log"), "1234").unwrap();
        let root = Root::open(ws.path()).unwrap();
        let found = scan(&root, &Staged::default(), limits());
        let Found::File { len, .. } = found.entries[0] else {
            panic!("{:?}", found.entries);
        };
        std::fs::write(ws.path().join("wächst.log"), "x".repeat(100_000)).unwrap();
        let store_dir = tempfile::tempdir().unwrap();
        let store = local_store(store_dir.path());
        let meta = store_one(&store, FileOwner::default(), &root, "wächst.log", len)
            .await
            .unwrap();
        assert_eq!(meta.size_bytes, 4);
    }

    /// A file with two names is stored once; both names are listed with its one id, and
    /// it counts once against the run's bound of files.
    #[tokio::test]
    async fn hard_links_are_stored_once_and_listed_under_every_name() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("a_données.bin"), "même").unwrap();
        std::fs::create_dir(ws.path().join("b")).unwrap();
        std::fs::hard_link(
            ws.path().join("a_données.bin"),
            ws.path().join("b/lien.bin"),
        )
        .unwrap();
        std::fs::write(ws.path().join("c.txt"), "c").unwrap();
        let store_dir = tempfile::tempdir().unwrap();
        let store: SharedStore = Arc::new(local_store(store_dir.path()));
        let limits = CollectLimits {
            max_files: 2,
            ..limits()
        };
        let got = collect(
            &store,
            FileOwner::default(),
            ws.path(),
            &Staged::default(),
            limits,
        )
        .await;
        assert!(got.skipped.is_empty(), "{:?}", got.skipped);
        let files: Vec<(&str, Option<&str>)> = got
            .files
            .iter()
            .filter(|f| f.kind == EntryKind::File)
            .map(|f| (f.path.as_str(), f.file_id.as_deref()))
            .collect();
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[0].0, "a_données.bin");
        assert_eq!(files[1].0, "b/lien.bin");
        assert_eq!(files[0].1, files[1].1);
        assert_eq!(files[2].0, "c.txt");
        assert_eq!(store.list_all().await.unwrap().len(), 2);
    }

    /// Past `max_files` the rest is skipped, each saying why; the first in path order are
    /// stored.
    #[tokio::test]
    async fn a_run_stores_at_most_max_files() {
        let ws = tempfile::tempdir().unwrap();
        for i in 0..7 {
            std::fs::write(ws.path().join(format!("f{i}_ü")), "x").unwrap();
        }
        let store_dir = tempfile::tempdir().unwrap();
        let store: SharedStore = Arc::new(local_store(store_dir.path()));
        let limits = CollectLimits {
            max_files: 4,
            ..limits()
        };
        let got = collect(
            &store,
            FileOwner::default(),
            ws.path(),
            &Staged::default(),
            limits,
        )
        .await;
        let stored: Vec<&str> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(stored, ["f0_ü", "f1_ü", "f2_ü", "f3_ü"]);
        let skipped: Vec<&str> = got.skipped.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(skipped, ["f4_ü", "f5_ü", "f6_ü"]);
        assert_eq!(
            got.skipped[0].reason,
            "the run left more than 4 files to store (workspace.max_files); the first 4 in \
             path order were stored"
        );
        assert_eq!(store.list_all().await.unwrap().len(), 4);
    }

    /// A file mostly holes is not stored; one with few holes, or a small one, is.
    #[tokio::test]
    async fn a_sparse_file_is_skipped_saying_so() {
        use std::io::{Seek, SeekFrom, Write};
        let ws = tempfile::tempdir().unwrap();
        let mut sparse = std::fs::File::create(ws.path().join("creux.bin")).unwrap();
        sparse.seek(SeekFrom::Start(99 << 20)).unwrap();
        sparse.write_all(b"!").unwrap();
        let small = std::fs::File::create(ws.path().join("petit.bin")).unwrap();
        small.set_len(512 << 10).unwrap();
        std::fs::write(ws.path().join("plein.bin"), vec![1u8; 900 << 10]).unwrap();
        let store_dir = tempfile::tempdir().unwrap();
        let store: SharedStore = Arc::new(local_store(store_dir.path()));
        let limits = CollectLimits {
            max_total_bytes: 200 << 20,
            ..limits()
        };
        let got = collect(
            &store,
            FileOwner::default(),
            ws.path(),
            &Staged::default(),
            limits,
        )
        .await;
        let stored: Vec<&str> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(stored, ["petit.bin", "plein.bin"]);
        assert_eq!(got.skipped.len(), 1, "{:?}", got.skipped);
        assert_eq!(got.skipped[0].path, "creux.bin");
        // The data is a byte, or its block, as the file system counts it.
        let reason = &got.skipped[0].reason;
        assert!(
            reason.starts_with("a sparse file: 99 MB long, of which only ")
                && reason.ends_with(
                    " is data and the rest holes; a file more than half holes (and over 1 MB \
                     of them) is not stored, as it would be stored and counted at its whole \
                     length"
                ),
            "{reason}"
        );
        assert!(store.list_all().await.unwrap().len() == 2);
    }

    #[test]
    fn too_sparse_is_more_than_half_holes_and_over_a_mib_of_them() {
        assert!(too_sparse(100 << 20, 4096));
        assert!(!too_sparse(1 << 20, 0));
        assert!(!too_sparse(4 << 20, 2 << 20));
        assert!(too_sparse(4 << 20, (2 << 20) - 1));
    }
}
