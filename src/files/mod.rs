//! Stored files: the [`FileStore`] trait, what a stored file is ([`FileMeta`]), how store
//! failures read ([`StoreError`]) and the TTL sweeper.
//!
//! - [`local`]: [`LocalStore`], the embedded default: a directory on local disk.
//! - [`names`]: what a stored file is called (its name, cut to 255 bytes keeping its
//!   extension), its MIME type, and its id as a client may give it.
//! - [`s3`]: [`S3Store`], an S3-compatible object store shared by every replica.
//! - [`observed`]: a decorator that times every store operation and counts its errors.
//! - [`watch`]: whether the store can serve, checked in the background for `/health`.
//! - [`workspace`]: staging stored files into a run's workspace and storing what the run
//!   wrote.
//!
//! The trait is deliberately small (put a stream, get a stream, list, delete, expire) so
//! both backends implement it the same way; `tests/integration/file_store.rs` runs one
//! conformance suite against each.

pub mod charge;
pub mod local;
pub mod names;
pub mod observed;
pub mod s3;
pub mod watch;
pub mod workspace;

use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

pub use self::charge::{Charge, Held, Holders, OwnerQuota, StoreBounds};
pub use self::local::LocalStore;
pub use self::names::{
    MAX_NAME_BYTES, canonical_file_id, clean_filename, clean_filename_within, mime_for,
};
pub use self::s3::S3Store;

/// A byte source the store reads from, or hands out.
pub type ByteReader = Box<dyn AsyncRead + Send + Unpin>;

/// What the store knows about one file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileMeta {
    pub file_id: String,
    /// A plain name (no directories), used for `Content-Disposition`.
    pub filename: String,
    pub size_bytes: u64,
    /// Guessed from the filename; `application/octet-stream` when unknown.
    pub mime_type: String,
    /// When the file was stored, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The API key (tenant) that stored it; `None` when the service runs without keys
    /// (and for metadata written before keys existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl FileMeta {
    /// `upload_time` on the wire: RFC 3339, UTC, seconds precision.
    pub fn upload_time(&self) -> String {
        rfc3339_utc(self.created_unix_ms / 1000)
    }

    /// Whether `owner` may see this file: only the tenant that stored it may. Without keys
    /// (`owner` is `None`) only files stored without keys are visible, so files of a
    /// tenant never show once keys are switched off, and unowned files never show to a
    /// tenant.
    pub fn visible_to(&self, owner: Option<&str>) -> bool {
        self.owner.as_deref() == owner
    }

    /// Whether the file outlived `ttl` at `now_ms`.
    pub fn expired(&self, ttl: Option<Duration>, now_ms: u64) -> bool {
        ttl.is_some_and(|ttl| now_ms.saturating_sub(self.created_unix_ms) >= ttl.as_millis() as u64)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("file {0:?} not found")]
    NotFound(String),
    #[error("the file is larger than the maximum of {max_bytes} bytes")]
    TooLarge { max_bytes: u64 },
    /// The file would take the store past its quota (`files.quota_mb`). Sizes are
    /// charges ([`Charge`]): `stored_bytes` is what the stored files are charged, the
    /// upload's charge is `charge.of(upload)`.
    #[error(
        "the file would take the store past its quota of {quota_bytes} bytes \
         ({stored_bytes} bytes charged, the file {upload})"
    )]
    QuotaExceeded {
        quota_bytes: u64,
        stored_bytes: u64,
        upload: UploadSize,
        charge: Charge,
        /// How much the largest holders hold, as the uploading key may see it; `None`
        /// without keys.
        holders: Option<Holders>,
    },
    /// The file would take its owner past its quota: its API key's own `max_stored_mb`
    /// (`own`), or the default share of a key without one (`files.key_share_percent`).
    #[error(
        "the file would take API key {owner:?} past its quota of {quota_bytes} bytes \
         ({stored_bytes} bytes charged, the file {upload})"
    )]
    OwnerQuotaExceeded {
        owner: String,
        quota_bytes: u64,
        stored_bytes: u64,
        upload: UploadSize,
        charge: Charge,
        own: bool,
    },
    /// The store (`owner` `None`: `files.max_files`) or the API key `owner`
    /// (`files.max_files_per_key`) holds as many files as it may.
    #[error("{} holds {max_files} files, the most it may", owner.as_deref().map_or("the file store".to_owned(), |o| format!("API key {o:?}")))]
    TooManyFiles {
        owner: Option<String>,
        max_files: u64,
    },
    /// The source of a `put` failed (a client that went away mid-upload, say).
    #[error("reading the file to store: {0}")]
    Source(io::Error),
    /// Another running instance has this store's directory open.
    #[error(
        "the file store directory {} is in use by another running snakecage (it holds {}/.lock); give each instance its own worker.state_dir (or files.dir)",
        dir.display(),
        dir.display()
    )]
    InUse { dir: PathBuf },
    /// The store cannot be reached or refused the request (an object store that is down,
    /// wrong credentials, a missing bucket): the service is unavailable, not the file.
    #[error("the file store is unavailable ({doing}): {detail}")]
    Unavailable { doing: &'static str, detail: String },
    #[error("{doing} {path}: {source}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl StoreError {
    /// Whether the store's file system refused to grow: full (ENOSPC, EDQUOT) or mounted
    /// read-only (EROFS). Not the caller's fault, and not a bug: 507 until space returns.
    pub fn is_out_of_space(&self) -> bool {
        match self {
            StoreError::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS)
            ),
            _ => false,
        }
    }

    /// How much of a file a quota's refusal had read, when that was only part of it.
    pub fn upload_read(&self) -> Option<u64> {
        match self {
            StoreError::QuotaExceeded {
                upload: UploadSize::AtLeast(n),
                ..
            }
            | StoreError::OwnerQuotaExceeded {
                upload: UploadSize::AtLeast(n),
                ..
            } => Some(*n),
            _ => None,
        }
    }

    /// A quota's refusal with the file's whole size, once it is known (`whole`: the bytes
    /// the store had read when it refused, plus the rest of the body, or the size of a file
    /// on disk). The refusal said only "at least"; with the whole size, a file larger than
    /// the whole quota is told so instead of being told to delete others and retry.
    #[must_use]
    pub fn with_whole_size(self, whole: u64) -> Self {
        let whole_of = |upload: UploadSize| match upload {
            UploadSize::AtLeast(n) if whole >= n => UploadSize::Whole(whole),
            other => other,
        };
        match self {
            StoreError::QuotaExceeded {
                quota_bytes,
                stored_bytes,
                upload,
                charge,
                holders,
            } => StoreError::QuotaExceeded {
                quota_bytes,
                stored_bytes,
                upload: whole_of(upload),
                charge,
                holders,
            },
            StoreError::OwnerQuotaExceeded {
                owner,
                quota_bytes,
                stored_bytes,
                upload,
                charge,
                own,
            } => StoreError::OwnerQuotaExceeded {
                owner,
                quota_bytes,
                stored_bytes,
                upload: whole_of(upload),
                charge,
                own,
            },
            other => other,
        }
    }
}

/// How much of an upload the store had read when a quota refused it: all of it, or the
/// part that passed the quota (a streamed body's size is known only at its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadSize {
    Whole(u64),
    AtLeast(u64),
}

impl UploadSize {
    pub fn bytes(self) -> u64 {
        match self {
            UploadSize::Whole(n) | UploadSize::AtLeast(n) => n,
        }
    }

    /// Whether the file, charged as `charge` says, is known to be larger than a whole
    /// quota of `quota_bytes`: no deletion and no wait makes room for it (a streamed file
    /// refused part-way is known only once what was read passes the quota).
    pub fn larger_than(self, quota_bytes: u64, charge: Charge) -> bool {
        charge.of(self.bytes()) > quota_bytes
    }
}

impl std::fmt::Display for UploadSize {
    /// `is 716800 bytes`, `is at least 393216 bytes`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UploadSize::Whole(n) => write!(f, "is {n} bytes"),
            UploadSize::AtLeast(n) => write!(f, "is at least {n} bytes"),
        }
    }
}

/// The words of a refusal for a quota: whose (`file storage`, `API key 'bob'`), which quota
/// with the setting that sets it (`its quota of 1 MB (files.quota_mb)`; `quota_bytes`, its
/// size), what is charged and the file's charge, and what the caller may do (`remedy`).
/// A file larger than the whole quota cannot be stored by deleting others, so it says so
/// instead.
pub struct QuotaWords<'a> {
    pub whose: &'a str,
    pub quota: &'a str,
    pub quota_bytes: u64,
    pub stored_bytes: u64,
    pub upload: UploadSize,
    pub charge: Charge,
    pub remedy: &'a str,
}

pub fn over_quota_detail(w: &QuotaWords<'_>) -> String {
    let head = format!("This file would take {} past {}", w.whose, w.quota);
    let n = w.upload.bytes();
    let charged = w.charge.of(n);
    let (size, counted) = (size_text(n), size_text(charged));
    let file = if size != counted {
        format!("{size}, counted as {counted}")
    } else if n <= w.quota_bytes && charged > w.quota_bytes {
        // Rounded alike, and only the charge does not fit: the exact charge says why.
        format!("{size}, counted as {charged} bytes")
    } else {
        size
    };
    if w.upload.larger_than(w.quota_bytes, w.charge) {
        return match w.upload {
            // A streamed file is refused part-way: its size is known only to be over the
            // quota.
            UploadSize::AtLeast(_) => {
                format!("{head}: the file is larger than the whole quota; upload a smaller file")
            }
            UploadSize::Whole(_) => format!(
                "{head}: the file ({file}) is larger than the whole quota; upload a smaller file"
            ),
        };
    }
    let at_least = if matches!(w.upload, UploadSize::AtLeast(_)) {
        "at least "
    } else {
        ""
    };
    format!(
        "{head}: {} is used and the file is {at_least}{file}; {}",
        size_text(w.stored_bytes),
        w.remedy
    )
}

/// What a refused caller may do when deleting its own files makes room.
pub const DELETE_AND_RETRY: &str = "delete files you no longer need and retry";

/// A size in the units people read: `512 bytes`, `700 KB`, `1.4 MB` (KB and MB of 1024).
pub fn size_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")];
    let Some(&(unit, name)) = UNITS.iter().find(|(unit, _)| bytes >= *unit) else {
        return format!("{bytes} bytes");
    };
    let tenths = (u128::from(bytes) * 10 + u128::from(unit) / 2) / u128::from(unit);
    match tenths % 10 {
        0 => format!("{} {name}", tenths / 10),
        d => format!("{}.{d} {name}", tenths / 10),
    }
}

/// Who stores a file, and how much that owner may store in all.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileOwner<'a> {
    /// The tenant; `None` without keys.
    pub name: Option<&'a str>,
    /// `None`: only the store's own quota applies.
    pub quota_bytes: Option<u64>,
}

/// Where files live. Implementations must make a file visible only once it is complete
/// (no half-written file is ever listed or served), keep metadata across restarts, and
/// treat a file past its TTL as gone even before the sweeper removed it.
#[async_trait::async_trait]
pub trait FileStore: Send + Sync + 'static {
    /// Stores everything `body` yields under a new id. Fails with `TooLarge` as soon as the
    /// body passes the store's maximum file size, and with `QuotaExceeded` when the store
    /// would grow past its quota (`OwnerQuotaExceeded` past the owner's); nothing is kept
    /// in either case. The file belongs to `owner.name`.
    async fn put(
        &self,
        owner: FileOwner<'_>,
        filename: &str,
        body: &mut (dyn AsyncRead + Send + Unpin),
    ) -> Result<FileMeta, StoreError>;

    /// Every lookup by id takes the caller: a file that is not [`FileMeta::visible_to`] it
    /// is `NotFound`, exactly as if it did not exist.
    async fn meta(&self, file_id: &str, owner: Option<&str>) -> Result<FileMeta, StoreError>;

    /// The file's metadata and a reader of its bytes: all of them, or only those of
    /// `range`, which must lie within the file (a download resolves a `Range` header
    /// against [`FileStore::meta`] first; a file never changes once stored). A backend
    /// reads the range alone, never the bytes before it.
    async fn get(
        &self,
        file_id: &str,
        owner: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<(FileMeta, ByteReader), StoreError>;

    /// Every live file `owner` may see, oldest first.
    async fn list(&self, owner: Option<&str>) -> Result<Vec<FileMeta>, StoreError>;

    /// Every live file of every owner (for the metrics).
    async fn list_all(&self) -> Result<Vec<FileMeta>, StoreError>;

    async fn delete(&self, file_id: &str, owner: Option<&str>) -> Result<(), StoreError>;

    /// Deletes the files past their TTL; returns how many. Safe to run on several replicas
    /// at once (deleting a file twice is no error).
    async fn remove_expired(&self) -> Result<usize, StoreError>;

    /// Whether the store can serve requests now (for `/health`): `Unavailable` when not.
    async fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// How this store charges a file, and the bounds it holds files to (to report usage
    /// as the quotas count it).
    fn charging(&self) -> (Charge, StoreBounds);

    /// The last time the store had to be rebuilt under the running service (its directory
    /// removed from outside), for `/health`; `None` if it never had to.
    fn last_recovery(&self) -> Option<StoreRecovery> {
        None
    }
}

/// A store rebuilt under the running service: when, and what was lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreRecovery {
    /// RFC 3339, UTC.
    pub at: String,
    /// Stored files whose bytes or metadata were gone, now forgotten.
    pub lost_files: usize,
    pub detail: String,
}

pub type SharedStore = Arc<dyn FileStore>;

/// Removes expired files every `interval` until `stop` fires.
pub fn spawn_sweeper(store: SharedStore, interval: Duration, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            match store.remove_expired().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(removed = n, "expired files removed"),
                Err(e) => tracing::warn!(error = %e, "sweeping expired files failed"),
            }
        }
    });
}

/// How often the sweeper runs for a given TTL: often enough that an expired file's space
/// comes back soon, rarely enough to cost nothing.
pub fn sweep_interval(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Copies an upload from `body` into `sink` in 64 KiB chunks, answering `TooLarge` past
/// `max_bytes`. Before each chunk is written, `admit(total, chunk)` may refuse it (a quota);
/// `write_failed` turns a write error into the backend's error. Returns the bytes copied;
/// `sink` is not flushed or closed.
pub(crate) async fn copy_upload<W: AsyncWrite + Unpin + ?Sized>(
    body: &mut (dyn AsyncRead + Send + Unpin),
    sink: &mut W,
    max_bytes: u64,
    mut admit: impl FnMut(u64, u64) -> Result<(), StoreError>,
    write_failed: impl Fn(io::Error) -> StoreError,
) -> Result<u64, StoreError> {
    let mut buf = vec![0u8; 64 << 10];
    let mut written = 0u64;
    loop {
        let n = body.read(&mut buf).await.map_err(StoreError::Source)?;
        if n == 0 {
            return Ok(written);
        }
        written += n as u64;
        if written > max_bytes {
            return Err(StoreError::TooLarge { max_bytes });
        }
        admit(written, n as u64)?;
        sink.write_all(&buf[..n]).await.map_err(&write_failed)?;
    }
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `secs` since the Unix epoch as RFC 3339 in UTC, e.g. `2023-11-14T22:13:20Z`.
pub fn rfc3339_utc(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_in_the_largest_unit_with_at_most_one_decimal() {
        assert_eq!(super::size_text(0), "0 bytes");
        assert_eq!(super::size_text(1023), "1023 bytes");
        assert_eq!(super::size_text(700 << 10), "700 KB");
        assert_eq!(super::size_text(1 << 20), "1 MB");
        assert_eq!(super::size_text((1 << 20) + (400 << 10)), "1.4 MB");
        assert_eq!(super::size_text(3 << 30), "3 GB");
    }

    #[test]
    fn a_quota_refusal_says_the_numbers_in_charges_and_never_that_the_quota_is_used_up() {
        use super::{Charge, DELETE_AND_RETRY, QuotaWords, UploadSize, over_quota_detail};
        let words = |stored_bytes, upload, charge| QuotaWords {
            whose: "file storage",
            quota: "its quota of 1 MB (files.quota_mb)",
            quota_bytes: 1 << 20,
            stored_bytes,
            upload,
            charge,
            remedy: DELETE_AND_RETRY,
        };
        // 700 KB used, 700 KB more: it would pass the quota, which is not full.
        assert_eq!(
            over_quota_detail(&words(
                700 << 10,
                UploadSize::Whole(700 << 10),
                Charge::BYTES
            )),
            "This file would take file storage past its quota of 1 MB \
             (files.quota_mb): 700 KB is used and the file is 700 KB; delete files you no \
             longer need and retry"
        );
        // Charged: its blocks and one more.
        assert_eq!(
            over_quota_detail(&words(1000 << 10, UploadSize::Whole(1), Charge::default())),
            "This file would take file storage past its quota of 1 MB \
             (files.quota_mb): 1000 KB is used and the file is 1 bytes, counted as 8 KB; \
             delete files you no longer need and retry"
        );
        // Only its charge is larger than the whole quota: still larger.
        assert_eq!(
            over_quota_detail(&words(0, UploadSize::Whole(1 << 20), Charge::default())),
            "This file would take file storage past its quota of 1 MB (files.quota_mb): the \
             file (1 MB, counted as 1052672 bytes) is larger than the whole quota; upload a smaller file"
        );
        // Nothing stored and a streamed file larger than the quota: deleting cannot help.
        assert_eq!(
            over_quota_detail(&QuotaWords {
                whose: "API key 'bob'",
                quota: "its own quota of 1 MB (max_stored_mb)",
                ..words(
                    0,
                    UploadSize::AtLeast((1 << 20) + (64 << 10)),
                    Charge::default()
                )
            }),
            "This file would take API key 'bob' past its own quota of 1 MB \
             (max_stored_mb): the file is larger than the whole quota; upload a smaller file"
        );
    }

    use super::*;

    #[test]
    fn rfc3339_dates_are_civil_utc() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_utc(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn expiry_is_relative_to_creation() {
        let meta = FileMeta {
            file_id: "x".into(),
            filename: "x".into(),
            size_bytes: 0,
            mime_type: "text/plain".into(),
            created_unix_ms: 10_000,
            owner: None,
        };
        assert!(!meta.expired(None, u64::MAX));
        assert!(!meta.expired(Some(Duration::from_secs(5)), 14_999));
        assert!(meta.expired(Some(Duration::from_secs(5)), 15_000));
    }
}
