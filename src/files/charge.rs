//! What a stored file costs the store, and the bounds that cost is held to.
//!
//! A file is charged a fixed cost per file (its metadata: on the local store a second file
//! of one block, on S3 the object's own record) plus its size rounded up to whole blocks.
//! One-byte files then cost what they take on disk (two inodes and two blocks each), not
//! one byte, and the quotas (`files.quota_mb`, a key's `max_stored_mb` or its default share)
//! count charges. The number of files is bounded besides (`files.max_files`,
//! `files.max_files_per_key`): inodes run out independently of bytes.

use std::path::Path;

use super::{FileOwner, StoreError, UploadSize};

/// The smallest block a file is charged in, and the per-file cost on every backend.
pub const BLOCK_BYTES: u64 = 4096;

/// How a file's size becomes its charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// Sizes are rounded up to a multiple of this.
    pub block: u64,
    /// Added once per file.
    pub per_file: u64,
}

impl Default for Charge {
    fn default() -> Self {
        Self {
            block: BLOCK_BYTES,
            per_file: BLOCK_BYTES,
        }
    }
}

impl Charge {
    /// File bytes alone: no rounding, no per-file cost (unit tests of the quota's own
    /// arithmetic use it).
    pub const BYTES: Charge = Charge {
        block: 1,
        per_file: 0,
    };

    /// The local store's charge: its file system's block (at least [`BLOCK_BYTES`]) for
    /// the data and one block per file for its metadata.
    pub fn for_dir(dir: &Path) -> Self {
        let block = nix::sys::statvfs::statvfs(dir)
            .map(|st| st.fragment_size())
            .unwrap_or(0)
            .clamp(BLOCK_BYTES, 1 << 20);
        Self {
            block,
            per_file: block,
        }
    }

    /// What a file of `size` bytes costs.
    pub fn of(&self, size: u64) -> u64 {
        let block = self.block.max(1);
        size.div_ceil(block)
            .saturating_mul(block)
            .saturating_add(self.per_file)
    }
}

/// The bounds a store holds its files to, beyond the size of one file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreBounds {
    /// The charges of all files together (`files.quota_mb`); `None`: no quota.
    pub quota_bytes: Option<u64>,
    /// Files in all (`files.max_files`); `None`: unbounded.
    pub max_files: Option<u64>,
    /// What an API key without `max_stored_mb` may hold (its share of `quota_bytes`,
    /// `files.key_share_percent`); `None`: unbounded.
    pub key_share_bytes: Option<u64>,
    /// Files one API key may hold (`files.max_files_per_key`); `None`: unbounded.
    pub max_files_per_key: Option<u64>,
}

impl StoreBounds {
    /// A store quota alone.
    pub fn quota(quota_bytes: Option<u64>) -> Self {
        Self {
            quota_bytes,
            ..Self::default()
        }
    }

    /// Why one more file of `owner`, of `upload` bytes charged as `charge`, does not fit
    /// beside what the store (`all`) and the owner (`mine`) hold, if it does not: the
    /// store's bounds first, then the owner's. `holders` says, for a store that is full,
    /// how much the largest holders hold (as the owner may see it).
    pub fn refusal(
        &self,
        charge: Charge,
        owner: FileOwner<'_>,
        (all, mine): (Held, Held),
        upload: UploadSize,
        holders: impl FnOnce() -> Option<Holders>,
    ) -> Option<StoreError> {
        let cost = charge.of(upload.bytes());
        if let Some(max_files) = self.max_files
            && all.files >= max_files
        {
            return Some(StoreError::TooManyFiles {
                owner: None,
                max_files,
            });
        }
        if let Some(quota) = self.quota_bytes
            && all.charged.saturating_add(cost) > quota
        {
            return Some(StoreError::QuotaExceeded {
                quota_bytes: quota,
                stored_bytes: all.charged,
                upload,
                charge,
                holders: holders(),
            });
        }
        let name = owner.name?;
        if let Some(max_files) = self.max_files_per_key
            && mine.files >= max_files
        {
            return Some(StoreError::TooManyFiles {
                owner: Some(name.to_owned()),
                max_files,
            });
        }
        let quota = self.owner_quota(Some(name), owner.quota_bytes)?;
        (mine.charged.saturating_add(cost) > quota.bytes).then(|| StoreError::OwnerQuotaExceeded {
            owner: name.to_owned(),
            quota_bytes: quota.bytes,
            stored_bytes: mine.charged,
            upload,
            charge,
            own: quota.own,
        })
    }

    /// The quota of an owner: its own (`max_stored_mb`), else a key's default share; none
    /// without keys (the store's quota is the only one then). `own` says which.
    pub fn owner_quota(&self, name: Option<&str>, own: Option<u64>) -> Option<OwnerQuota> {
        name?;
        match own {
            Some(bytes) => Some(OwnerQuota { bytes, own: true }),
            None => self
                .key_share_bytes
                .map(|bytes| OwnerQuota { bytes, own: false }),
        }
    }
}

/// An owner's byte quota and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerQuota {
    pub bytes: u64,
    /// `true`: the key's own `max_stored_mb`; `false`: the default share.
    pub own: bool,
}

/// What a store (or one owner) holds: files and their charges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub files: u64,
    pub charged: u64,
}

/// How much the largest holders of a full store hold, as the caller may see it: its own
/// share and rank, and the largest share, never whose it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holders {
    /// Charged to the caller's key.
    pub caller: u64,
    /// 1 for the largest holder; `None` when the caller holds nothing.
    pub caller_rank: Option<usize>,
    /// Charged to the largest holder.
    pub largest: u64,
    /// Keys holding anything.
    pub keys: usize,
}

impl Holders {
    /// For a store at its quota: names the largest holders in the operator's log and
    /// returns what `caller` may be told (how it compares, never whose the rest is).
    pub fn of_full_store(caller: &str, mut charges: Vec<(Option<&str>, u64)>) -> Self {
        charges.sort_by_key(|c| std::cmp::Reverse(c.1));
        tracing::warn!(
            largest_holders = ?&charges[..charges.len().min(3)],
            "the file store is at its quota (files.quota_mb)"
        );
        Self::of(caller, charges)
    }

    /// The holders from every key's charge (`None`: files stored without a key).
    pub fn of<'a>(caller: &str, used: impl IntoIterator<Item = (Option<&'a str>, u64)>) -> Self {
        let mut charges: Vec<(u64, bool)> = used
            .into_iter()
            .filter(|(owner, bytes)| owner.is_some() && *bytes > 0)
            .map(|(owner, bytes)| (bytes, owner == Some(caller)))
            .collect();
        // The largest first; on a tie the caller ranks first (no key looks larger than
        // it is by the order of a map).
        charges.sort_by(|a, b| b.cmp(a));
        Self {
            caller: charges.iter().find(|c| c.1).map_or(0, |c| c.0),
            caller_rank: charges.iter().position(|c| c.1).map(|i| i + 1),
            largest: charges.first().map_or(0, |c| c.0),
            keys: charges.len(),
        }
    }

    /// `this API key holds 2 MB of it, the most of any of the 3 keys holding files`, …
    pub fn describe(&self) -> String {
        let caller = super::size_text(self.caller);
        match self.caller_rank {
            Some(1) => format!(
                "this API key holds {caller} of it, the most of the {} key(s) holding files",
                self.keys
            ),
            Some(rank) => format!(
                "this API key holds {caller} of it (the {} largest of {} keys); the largest \
                 holder, another key, holds {}",
                ordinal(rank),
                self.keys,
                super::size_text(self.largest)
            ),
            None => format!(
                "this API key holds nothing of it; the largest holder, another key, holds {}",
                super::size_text(self.largest)
            ),
        }
    }
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_costs_its_blocks_and_one_more() {
        let c = Charge::default();
        assert_eq!(c.of(0), 4096);
        assert_eq!(c.of(1), 8192);
        assert_eq!(c.of(4096), 8192);
        assert_eq!(c.of(4097), 12288);
        // 10,000 one-byte files: the ~80 MB they take on disk, not 10 KB.
        assert_eq!(10_000 * c.of(1), 81_920_000);
        assert_eq!(c.of(u64::MAX), u64::MAX);
        let big = Charge {
            block: 65536,
            per_file: 65536,
        };
        assert_eq!(big.of(1), 131072);
        assert_eq!(Charge::BYTES.of(7), 7);
    }

    #[test]
    fn a_file_system_block_is_at_least_four_kib() {
        let dir = tempfile::tempdir().unwrap();
        let c = Charge::for_dir(dir.path());
        assert!(c.block >= BLOCK_BYTES && c.block.is_power_of_two(), "{c:?}");
        assert_eq!(c.per_file, c.block);
        assert_eq!(
            Charge::for_dir(Path::new("/nonexistent/x")),
            Charge::default()
        );
    }

    #[test]
    fn a_key_without_its_own_quota_has_the_default_share_and_no_key_has_none() {
        let bounds = StoreBounds {
            key_share_bytes: Some(100),
            ..StoreBounds::default()
        };
        assert_eq!(
            bounds.owner_quota(Some("a"), None),
            Some(OwnerQuota {
                bytes: 100,
                own: false
            })
        );
        assert_eq!(
            bounds.owner_quota(Some("a"), Some(7)),
            Some(OwnerQuota {
                bytes: 7,
                own: true
            })
        );
        assert_eq!(bounds.owner_quota(None, Some(7)), None);
        assert_eq!(StoreBounds::default().owner_quota(Some("a"), None), None);
    }

    #[test]
    fn holders_say_the_callers_rank_and_the_largest_share_never_a_name() {
        let used = [
            (Some("alice"), 3 << 20),
            (Some("bob"), 1 << 20),
            (None, 5 << 20),
            (Some("carol"), 0),
        ];
        let h = Holders::of("bob", used);
        assert_eq!(
            h,
            Holders {
                caller: 1 << 20,
                caller_rank: Some(2),
                largest: 3 << 20,
                keys: 2
            }
        );
        let text = h.describe();
        assert_eq!(
            text,
            "this API key holds 1 MB of it (the 2nd largest of 2 keys); the largest holder, \
             another key, holds 3 MB"
        );
        assert!(!text.contains("alice"));
        assert_eq!(
            Holders::of("alice", used).describe(),
            "this API key holds 3 MB of it, the most of the 2 key(s) holding files"
        );
        assert_eq!(
            Holders::of("dave", used).describe(),
            "this API key holds nothing of it; the largest holder, another key, holds 3 MB"
        );
        // A tie: the caller is not told another key holds more.
        let tie = Holders::of("b", [(Some("a"), 5), (Some("b"), 5)]);
        assert_eq!(tie.caller_rank, Some(1));
        assert_eq!(ordinal(11), "11th");
        assert_eq!(ordinal(23), "23rd");
    }
}
