//! The keys file and its entries: a key's tenant name, SHA-256, limits and scopes; creating
//! keys (only their hash is stored) and checking entries ([`check_entries`], the one check
//! the service, a reload and the `snakecage keys` commands all use).
//!
//! `snakecage keys add` changes the file under an exclusive lock (`FILE.lock` beside it,
//! held from the read to the rename), so concurrent adds all land; it edits the TOML in
//! place (the operator's comments and layout stay) and keeps the file's mode and owner. It
//! writes nothing when the file, with the new key, is one the service would refuse.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What every new key starts with, so it is recognisable in a secret scanner or a log.
pub const KEY_PREFIX: &str = "sc_";

/// One configured key: its tenant's name, its hash and its limits.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// The tenant: files and sessions belong to it. Unique.
    pub name: String,
    /// SHA-256 of the key, 64 lowercase hex digits.
    pub sha256: String,
    /// Executions (stateless and session runs) this key may have in progress at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    /// Sessions this key may hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<usize>,
    /// Total size of the files this key may keep stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stored_mb: Option<u64>,
    /// What the key may do beyond running code: `admin` allows `/v1/admin/*` (reload,
    /// packages). Empty: an ordinary key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
}

/// The scope that allows the admin routes (`/v1/admin/*`).
pub const ADMIN_SCOPE: &str = "admin";

/// Every scope a key may have.
pub const SCOPES: &[&str] = &[ADMIN_SCOPE];

/// A keys file: `[[keys]]` tables of [`KeyEntry`].
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysFile {
    #[serde(default)]
    pub keys: Vec<KeyEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("reading keys file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "keys file {path} does not exist; give the right path, or create it with `snakecage keys add NAME --keys-file {path}`"
    )]
    Missing { path: PathBuf },
    #[error(
        "auth.keys_file {path} holds no keys; add one with `snakecage keys add` or unset auth.keys_file to run without keys"
    )]
    Empty { path: PathBuf },
    /// `keys add` creates the file, not the directories above it.
    #[error(
        "the directory {dir} of keys file {path} does not exist; create it first (e.g. `install -d -m 700 {dir}`)"
    )]
    NoDirectory { path: PathBuf, dir: PathBuf },
    #[error("locking keys file {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("keys file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("writing keys file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("API key {name:?}: {reason}")]
    Invalid { name: String, reason: String },
    #[error("an API key named {0:?} already exists; key names are unique")]
    Duplicate(String),
    /// `snakecage keys add` or `keys list` of a file with an entry the service refuses.
    #[error(
        "keys file {path}: {source}; the service refuses to start or reload with it: fix or remove that entry"
    )]
    Refused {
        path: PathBuf,
        source: Box<KeysError>,
    },
    /// A reload of a configuration that has no key left.
    #[error(
        "the configuration has no API key left (no [[auth.keys]] and no auth.keys_file): a reload never turns authentication off; put a key back, or restart the service to run without keys"
    )]
    NoneLeft,
    /// A reload of a configuration with keys, for a service started without any.
    #[error(
        "the configuration has API keys now, but the service started without any: requiring keys needs a restart"
    )]
    WouldTurnOn,
    #[error("the OS random number generator failed: {0}")]
    Random(String),
}

impl KeysFile {
    /// Reads `path`; a file that does not exist yet has no keys.
    pub fn read(path: &Path) -> Result<Self, KeysError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(KeysError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        Self::parse(path, &text)
    }

    /// Replaces `path` atomically with these keys (see [`replace`]); a new file is
    /// readable by its owner only.
    pub fn write(&self, path: &Path) -> Result<(), KeysError> {
        replace(path, &toml::to_string(self).expect("keys serialise"))
    }

    /// Adds a new key named `name` with `limits` to the file at `path` (created when
    /// missing) and returns the key. The whole read-modify-write holds an exclusive lock
    /// on `path.lock`, so concurrent adds each land; the entry is appended to the TOML as
    /// written (comments, order and layout stay); the file keeps its mode and owner.
    pub fn add_to(path: &Path, name: &str, limits: KeyEntry) -> Result<String, KeysError> {
        Self::add_beside(path, &[], name, limits)
    }

    /// [`Self::add_to`], the file checked together with `inline`, the keys the service
    /// reads beside it (`[[auth.keys]]`). A file the service would refuse, before or with
    /// the new key, is `Refused` (a name already taken, `Duplicate`) and left as it was.
    pub fn add_beside(
        path: &Path,
        inline: &[KeyEntry],
        name: &str,
        limits: KeyEntry,
    ) -> Result<String, KeysError> {
        let _lock = lock(path)?;
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(KeysError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let mut file = Self::parse(path, &text)?;
        file.check(path, inline)?;
        if inline.iter().any(|k| k.name == name) {
            return Err(KeysError::Duplicate(name.to_owned()));
        }
        let key = file.add(name, limits)?;
        file.check(path, inline)?;
        let entry = file.keys.last().expect("just added");
        let mut document: toml_edit::DocumentMut =
            text.parse()
                .map_err(|e: toml_edit::TomlError| KeysError::Write {
                    path: path.to_owned(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
                })?;
        append_entry(&mut document, entry);
        replace(path, &document.to_string())?;
        Ok(key)
    }

    /// Reads `path` and checks it (with `inline`, as [`Self::add_beside`]) as the service
    /// would: a file it would refuse is `Refused`.
    pub fn read_checked(path: &Path, inline: &[KeyEntry]) -> Result<Self, KeysError> {
        let file = Self::read(path)?;
        file.check(path, inline)?;
        Ok(file)
    }

    /// [`check_entries`] of `inline` and these keys, a refusal naming the file at `path`.
    fn check(&self, path: &Path, inline: &[KeyEntry]) -> Result<(), KeysError> {
        let entries: Vec<KeyEntry> = inline.iter().chain(&self.keys).cloned().collect();
        check_entries(&entries)
            .map(drop)
            .map_err(|source| KeysError::Refused {
                path: path.to_owned(),
                source: Box::new(source),
            })
    }

    fn parse(path: &Path, text: &str) -> Result<Self, KeysError> {
        toml::from_str(text).map_err(|source| KeysError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }

    /// Adds a new key named `name` with `limits`; returns the key, which exists nowhere
    /// else (only its hash is kept).
    pub fn add(&mut self, name: &str, limits: KeyEntry) -> Result<String, KeysError> {
        if self.keys.iter().any(|k| k.name == name) {
            return Err(KeysError::Duplicate(name.to_owned()));
        }
        let key = generate_key()?;
        let entry = KeyEntry {
            name: name.to_owned(),
            sha256: sha256_hex(&key),
            ..limits
        };
        validate(&entry)?;
        self.keys.push(entry);
        Ok(key)
    }
}

/// Holds an exclusive advisory lock on `path.lock` (created beside the keys file, kept)
/// until dropped. A lock file rather than the keys file itself: the keys file is replaced
/// by a rename, and a lock on the old inode would not exclude a writer that opened the new.
fn lock(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, KeysError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let err = |source| KeysError::Lock {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|source| match path.parent() {
            Some(dir)
                if source.kind() == std::io::ErrorKind::NotFound
                    && !dir.as_os_str().is_empty()
                    && !dir.is_dir() =>
            {
                KeysError::NoDirectory {
                    path: path.to_owned(),
                    dir: dir.to_owned(),
                }
            }
            _ => err(source),
        })?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| err(std::io::Error::from(errno)))
}

/// Appends `entry` as one more `[[keys]]` table (or one more element of an inline
/// `keys = [...]` array) to `document`, leaving everything else as it was.
fn append_entry(document: &mut toml_edit::DocumentMut, entry: &KeyEntry) {
    use toml_edit::{Item, Table, value};
    let mut table = Table::new();
    table.insert("name", value(entry.name.as_str()));
    table.insert("sha256", value(entry.sha256.as_str()));
    let limits = [
        ("max_concurrent", entry.max_concurrent.map(|n| n as u64)),
        ("max_sessions", entry.max_sessions.map(|n| n as u64)),
        ("max_stored_mb", entry.max_stored_mb),
    ];
    for (key, limit) in limits {
        if let Some(limit) = limit {
            table.insert(key, value(i64::try_from(limit).unwrap_or(i64::MAX)));
        }
    }
    if !entry.scopes.is_empty() {
        let scopes: toml_edit::Array = entry.scopes.iter().map(String::as_str).collect();
        table.insert("scopes", value(scopes));
    }
    match document.get_mut("keys") {
        Some(Item::Value(toml_edit::Value::Array(inline))) => {
            inline.push(table.into_inline_table());
        }
        Some(Item::ArrayOfTables(tables)) => tables.push(table),
        _ => {
            // A file of comments only holds them after its (absent) tables: they stay
            // above the first key instead of moving below it.
            let leading = document.trailing().as_str().unwrap_or_default().to_owned();
            if !leading.trim().is_empty() {
                table.decor_mut().set_prefix(leading);
                document.set_trailing("");
            }
            let mut tables = toml_edit::ArrayOfTables::new();
            tables.push(table);
            document.insert("keys", Item::ArrayOfTables(tables));
        }
    }
}

/// Replaces `path` with `text` atomically: a temporary file beside it, given the mode and
/// owner of the file it replaces (a new file: 0600, this process's), fsynced, renamed over
/// it.
fn replace(path: &Path, text: &str) -> Result<(), KeysError> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let err = |source| KeysError::Write {
        path: path.to_owned(),
        source,
    };
    let existing = match std::fs::metadata(path) {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(err(source)),
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        if let Some(meta) = &existing {
            let created = f.metadata()?;
            if (meta.uid(), meta.gid()) != (created.uid(), created.gid()) {
                std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
            }
            f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(err)
}

/// A new key: `sc_` and 32 random bytes in hex.
pub fn generate_key() -> Result<String, KeysError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| KeysError::Random(e.to_string()))?;
    Ok(format!("{KEY_PREFIX}{}", hex(&bytes)))
}

/// The SHA-256 of `key` as stored: 64 lowercase hex digits.
pub fn sha256_hex(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Checks configured keys as the service does before using any (at start, on a reload,
/// and in `snakecage keys add` and `list`): each entry valid, no name twice, no key hash
/// twice. Returns each entry's SHA-256, in order.
pub fn check_entries(entries: &[KeyEntry]) -> Result<Vec<[u8; 32]>, KeysError> {
    let mut names = HashSet::new();
    let mut digests = HashSet::new();
    let mut checked = Vec::with_capacity(entries.len());
    for entry in entries {
        let digest = validate(entry)?;
        if !names.insert(entry.name.as_str()) {
            return Err(KeysError::Duplicate(entry.name.clone()));
        }
        if !digests.insert(digest) {
            return Err(KeysError::Invalid {
                name: entry.name.clone(),
                reason: "the same key hash is configured twice".into(),
            });
        }
        checked.push(digest);
    }
    Ok(checked)
}

fn validate(entry: &KeyEntry) -> Result<[u8; 32], KeysError> {
    let invalid = |reason: &str| KeysError::Invalid {
        name: entry.name.clone(),
        reason: reason.to_owned(),
    };
    let name_ok = !entry.name.is_empty()
        && entry.name.len() <= 64
        && entry
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !name_ok {
        return Err(invalid(
            "a name is 1 to 64 characters, each an ASCII letter or digit, `-`, `_` or `.`",
        ));
    }
    if entry.max_concurrent == Some(0) || entry.max_sessions == Some(0) {
        return Err(invalid(
            "max_concurrent and max_sessions must be at least 1 (leave them out for no limit)",
        ));
    }
    if let Some(unknown) = entry.scopes.iter().find(|s| !SCOPES.contains(&s.as_str())) {
        return Err(invalid(&format!(
            "unknown scope {unknown:?}; the scopes are: {}",
            SCOPES.join(", ")
        )));
    }
    parse_hex32(&entry.sha256.to_ascii_lowercase())
        .ok_or_else(|| invalid("sha256 must be 64 hex digits (the SHA-256 of the key)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_added_key_is_appended_and_the_operators_comments_and_layout_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        let written = "# Schlüssel des Teams — monatlich rotiert\n\n\
                       [[keys]]\n# Bereitschaft\nname = \"ops\"  # Jörg\n\
                       sha256 = \"{hash}\"\nscopes = [\"admin\"]\n";
        let written = written.replace("{hash}", &sha256_hex("sc_ops"));
        std::fs::write(&path, &written).unwrap();
        let key = KeysFile::add_to(
            &path,
            "alice",
            KeyEntry {
                max_concurrent: Some(2),
                scopes: vec![ADMIN_SCOPE.into()],
                ..KeyEntry::default()
            },
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let added = format!(
            "\n[[keys]]\nname = \"alice\"\nsha256 = \"{}\"\nmax_concurrent = 2\nscopes = [\"admin\"]\n",
            sha256_hex(&key)
        );
        assert_eq!(text, format!("{written}{added}"));
        let names: Vec<String> = KeysFile::read(&path)
            .unwrap()
            .keys
            .into_iter()
            .map(|k| k.name)
            .collect();
        assert_eq!(names, ["ops", "alice"]);

        // Keys written as an inline array get one more element.
        std::fs::write(&path, "keys = [] # noch keine\n").unwrap();
        KeysFile::add_to(&path, "bob", KeyEntry::default()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("# noch keine\n"), "{text}");
        assert_eq!(KeysFile::read(&path).unwrap().keys[0].name, "bob");
    }
}
