//! The object keys of the S3 store: `<prefix>/<owner>/<file_id>/<filename>`, and back.
//!
//! Everything the store knows about a file is in its key and the object's size, so one
//! listing answers `GET /v1/files` and the quota, and one PUT (atomic in S3: an object is
//! visible only once complete) is the whole commit. The owner segment makes tenant scoping
//! structural: a lookup only ever lists under the caller's own segment. The file id is a
//! UUIDv7, whose first 48 bits are the creation time in milliseconds (for the TTL).

use object_store::path::{Path, PathPart};
use percent_encoding::percent_decode_str;

/// The owner segment of files stored without API keys.
const NO_OWNER: &str = "_";
/// Before the (encoded) name of an owner with a key.
const OWNER_PREFIX: &str = "k.";

#[derive(Debug, Clone)]
pub struct Keys {
    root: Path,
}

/// A stored object's key, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub owner: Option<String>,
    pub file_id: String,
    pub filename: String,
    pub created_unix_ms: u64,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        let root = Path::from_iter(prefix.split('/').filter(|p| !p.is_empty()));
        Self { root }
    }

    /// Everything the store wrote is under this.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A prefix never written under, for reachability probes.
    pub fn probe(&self) -> Path {
        self.root.clone().join(".probe")
    }

    /// Every file of `owner` is under this.
    pub fn owner_dir(&self, owner: Option<&str>) -> Path {
        let part = match owner {
            None => PathPart::from(NO_OWNER),
            Some(name) => PathPart::from(format!("{OWNER_PREFIX}{name}")),
        };
        self.root.clone().join(part)
    }

    /// The one object of file `file_id` is under this.
    pub fn file_dir(&self, owner: Option<&str>, file_id: &str) -> Path {
        self.owner_dir(owner).join(file_id)
    }

    /// The bytes `filename` takes in an object key: it is percent-encoded there (every
    /// byte that is not ASCII, and a few that are, take three). S3-compatible stores limit
    /// a key's segment to 255 bytes (MinIO, SeaweedFS) and the whole key to 1024 (S3).
    pub fn name_bytes(filename: &str) -> usize {
        PathPart::from(filename).as_ref().len()
    }

    pub fn object(&self, owner: Option<&str>, file_id: &str, filename: &str) -> Path {
        self.file_dir(owner, file_id).join(filename)
    }

    /// The file an object key names, or `None` for a key the store did not write.
    pub fn parse(&self, key: &Path) -> Option<Parsed> {
        let mut rest = key.prefix_match(&self.root)?;
        let owner = decode(rest.next()?.as_ref())?;
        let file_id = decode(rest.next()?.as_ref())?;
        let filename = decode(rest.next()?.as_ref())?;
        if rest.next().is_some() {
            return None;
        }
        let owner = match owner.as_str() {
            NO_OWNER => None,
            other => Some(other.strip_prefix(OWNER_PREFIX)?.to_owned()),
        };
        let created_unix_ms = created_ms(&file_id)?;
        Some(Parsed {
            owner,
            file_id,
            filename,
            created_unix_ms,
        })
    }
}

/// A new file id: a UUIDv7 (time-ordered, carries its creation time).
pub fn new_file_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

/// When a file id of this store was made, or `None` if it is not one of its ids.
pub fn created_ms(file_id: &str) -> Option<u64> {
    let id = uuid::Uuid::try_parse(file_id).ok()?;
    if id.hyphenated().to_string() != file_id || id.get_version_num() != 7 {
        return None;
    }
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    Some(secs * 1000 + u64::from(nanos / 1_000_000))
}

fn decode(part: &str) -> Option<String> {
    percent_decode_str(part)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_awkward_names_and_owners() {
        let keys = Keys::new("/deploy/a/");
        let id = new_file_id();
        for (owner, name) in [
            (None, "data.csv"),
            (Some("alice"), "résumé 100%.txt"),
            (Some("k.x"), "a#b?c[1]{2}*~.bin"),
            (Some("_"), "%2E"),
            (None, "..."),
        ] {
            let key = keys.object(owner, &id, name);
            assert!(key.as_ref().starts_with("deploy/a/"), "{key}");
            let parsed = keys.parse(&key).unwrap();
            assert_eq!(parsed.owner.as_deref(), owner);
            assert_eq!(parsed.file_id, id);
            assert_eq!(parsed.filename, name);
            // The owner segment keeps tenants apart even for look-alike names.
            assert!(
                keys.file_dir(owner, &id)
                    .prefix_matches(&keys.owner_dir(owner))
            );
        }
        assert_ne!(keys.owner_dir(None), keys.owner_dir(Some("_")));
        assert!(keys.parse(&Path::from("deploy/a/_/x")).is_none());
        assert!(keys.parse(&Path::from("other/_/x/y")).is_none());
        let v4 = uuid::Uuid::new_v4().to_string();
        assert!(keys.parse(&keys.object(None, &v4, "x")).is_none());
    }

    #[test]
    fn a_name_is_counted_as_the_key_holds_it() {
        assert_eq!(Keys::name_bytes("data.csv"), 8);
        assert_eq!(Keys::name_bytes("é.csv"), 6 + 4);
        assert_eq!(Keys::name_bytes("100%.txt"), 10);
        let cut = crate::files::clean_filename_within(
            &format!("{}.csv", "é".repeat(200)),
            Keys::name_bytes,
        );
        assert_eq!(cut, format!("{}.csv", "é".repeat(41)));
        assert!(Keys::name_bytes(&cut) <= crate::files::MAX_NAME_BYTES);
    }

    #[test]
    fn file_ids_carry_their_creation_time() {
        let before = crate::files::now_unix_ms();
        let id = new_file_id();
        let after = crate::files::now_unix_ms();
        let created = created_ms(&id).unwrap();
        assert!(
            (before..=after).contains(&created),
            "{before} {created} {after}"
        );
        assert_eq!(created_ms("not-an-id"), None);
        assert_eq!(created_ms(&id.to_uppercase()), None);
    }
}
