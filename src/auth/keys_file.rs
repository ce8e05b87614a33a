//! The keys file and its entries: a key's tenant name, SHA-256, limits and scopes; creating
//! keys (only their hash is stored) and checking entries.

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
        toml::from_str(&text).map_err(|source| KeysError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }

    /// Replaces `path` atomically (a temporary file beside it, fsynced, renamed over it),
    /// readable by its owner only.
    pub fn write(&self, path: &Path) -> Result<(), KeysError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let err = |source| KeysError::Write {
            path: path.to_owned(),
            source,
        };
        let text = toml::to_string(self).expect("keys serialise");
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(err)
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

pub(super) fn validate(entry: &KeyEntry) -> Result<[u8; 32], KeysError> {
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
