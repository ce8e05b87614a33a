//! The keys in force, swappable: a reload (HTTP or SIGHUP) re-reads `auth.keys_file` and,
//! once the reload has gone through, the new keys replace the old at once for every
//! request that starts after it. A keys file that does not parse, or holds no key, is
//! refused and the keys in force stay: a reload never turns authentication off.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde::Serialize;

use super::{Keys, KeysError, Tenant};
use crate::config::AuthConfig;

/// The swappable cell holding the current [`Keys`].
#[derive(Debug)]
pub struct KeyRing(RwLock<Arc<Keys>>);

/// What a re-read of the keys file changed, by key name (tenant).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct KeysChange {
    /// The keys file that was re-read.
    pub file: PathBuf,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Names whose key, limits or scopes changed.
    pub changed: Vec<String>,
}

impl KeysChange {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// For a message or a log line: "added bob; removed alice", or "no key changed".
    pub fn summary(&self) -> String {
        let parts: Vec<String> = [
            ("added", &self.added),
            ("removed", &self.removed),
            ("changed", &self.changed),
        ]
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(what, names)| format!("{what} {}", names.join(", ")))
        .collect();
        if parts.is_empty() {
            "no key changed".into()
        } else {
            parts.join("; ")
        }
    }
}

impl KeyRing {
    pub fn new(keys: Keys) -> Self {
        Self(RwLock::new(Arc::new(keys)))
    }

    /// The keys in force (cheap: one `Arc` clone under a read lock).
    pub fn load(&self) -> Arc<Keys> {
        self.0.read().expect("keys lock").clone()
    }

    /// Re-reads the keys of `config` (its keys file and inline keys), checked as at start
    /// (a keys file that is missing, does not parse or holds no key is an error), and
    /// says what differs from the keys in force. Installs nothing: see [`Self::store`].
    /// `None` when no keys file is configured (inline keys change only with a restart).
    /// A tenant whose key, limits and scopes are unchanged keeps its running executions'
    /// count.
    pub fn reread(&self, config: &AuthConfig) -> Result<Option<(Keys, KeysChange)>, KeysError> {
        let Some(file) = &config.keys_file else {
            return Ok(None);
        };
        let mut next = Keys::load(config)?;
        let current = self.load();
        next.loopback = current.loopback;
        let mut change = KeysChange {
            file: file.clone(),
            ..KeysChange::default()
        };
        for tenant in &mut next.tenants {
            match current.tenants.iter().find(|t| t.name == tenant.name) {
                Some(old) if same_key(old, tenant) => *tenant = old.clone(),
                Some(_) => change.changed.push(tenant.name.clone()),
                None => change.added.push(tenant.name.clone()),
            }
        }
        change.removed = current
            .tenants
            .iter()
            .filter(|old| !next.tenants.iter().any(|t| t.name == old.name))
            .map(|old| old.name.clone())
            .collect();
        Ok(Some((next, change)))
    }

    /// Makes `keys` the keys in force for every request that starts from now on.
    pub fn store(&self, keys: Keys) {
        *self.0.write().expect("keys lock") = Arc::new(keys);
    }
}

fn same_key(a: &Tenant, b: &Tenant) -> bool {
    a.digest == b.digest
        && a.max_concurrent == b.max_concurrent
        && a.max_sessions == b.max_sessions
        && a.max_stored_bytes == b.max_stored_bytes
        && a.scopes == b.scopes
}

#[cfg(test)]
mod tests {
    use super::super::{KeyEntry, KeysFile};
    use super::*;

    #[test]
    fn a_reread_names_what_changed_and_a_broken_or_empty_file_keeps_the_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clés.toml");
        let alice = KeysFile::add_to(&path, "alice", KeyEntry::default()).unwrap();
        let bob = KeysFile::add_to(&path, "bob", KeyEntry::default()).unwrap();
        let config = AuthConfig {
            keys_file: Some(path.clone()),
            ..AuthConfig::default()
        };
        let ring = KeyRing::new(Keys::load(&config).unwrap());
        let before = ring.load().tenant(&alice).unwrap();

        let mut file = KeysFile::read(&path).unwrap();
        file.keys.retain(|k| k.name != "bob");
        let carol = file.add("carol", KeyEntry::default()).unwrap();
        file.write(&path).unwrap();
        let (keys, change) = ring.reread(&config).unwrap().unwrap();
        assert_eq!(change.added, ["carol"]);
        assert_eq!(change.removed, ["bob"]);
        assert!(change.changed.is_empty());
        assert_eq!(change.summary(), "added carol; removed bob");
        ring.store(keys);
        let keys = ring.load();
        assert!(keys.tenant(&bob).is_none());
        assert_eq!(keys.tenant(&carol).unwrap().name, "carol");
        // An unchanged tenant is the same one (its running executions still count).
        assert!(Arc::ptr_eq(&before, &keys.tenant(&alice).unwrap()));

        std::fs::write(&path, "[[keys]]\nname = \"dave\"\n").unwrap();
        let err = ring.reread(&config).unwrap_err();
        assert!(err.to_string().contains("clés.toml"), "{err}");
        std::fs::write(&path, "# every key was removed\n").unwrap();
        let err = ring.reread(&config).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds no keys; add one with `snakecage keys add`"),
            "{err}"
        );
        assert_eq!(ring.load().tenant(&carol).unwrap().name, "carol");
    }
}
