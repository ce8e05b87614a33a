//! The keys in force, swappable: a reload (HTTP or SIGHUP) re-reads `auth.keys_file` and
//! the inline `[[auth.keys]]` of the configuration file and, once the reload has gone
//! through, the new key set replaces the old one whole, at once, for every request that
//! starts after it. Keys that do not parse or check, a keys file that holds no key, or a
//! configuration left with no key at all are refused and the keys in force stay: a reload
//! never turns authentication off (nor on: a service started without keys needs a
//! restart to require them).
//!
//! A tenant is its name: whatever a reload changes in a key's entry (limits, scopes, its
//! secret), the tenant of that name keeps its running executions' count (see
//! [`super::running`]), as it keeps its files and sessions. A name removed and added back
//! while its runs still go finds them counted too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};

use serde::Serialize;

use super::{Keys, KeysError, Running, Tenant};
use crate::config::AuthConfig;

/// The swappable cell holding the current [`Keys`].
#[derive(Debug)]
pub struct KeyRing {
    keys: RwLock<Arc<Keys>>,
    /// Every name's execution count while anything holds it: a tenant in force, or a run
    /// of a name since removed.
    running: Mutex<HashMap<String, Weak<Running>>>,
}

/// What a re-read of the keys changed, by key name (tenant).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct KeysChange {
    /// The keys file that was re-read, if one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The configuration file whose inline keys (`[[auth.keys]]`) were re-read, when it
    /// has some or had some before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_file: Option<PathBuf>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Names whose key, limits or scopes changed.
    pub changed: Vec<String>,
}

impl KeysChange {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// Where the keys were re-read from, for a message or a log line: the keys file, "the
    /// [[auth.keys]] of FILE", or both.
    pub fn source(&self) -> String {
        let inline = self.config_file.as_ref().map_or_else(
            || "the [[auth.keys]] of the configuration".to_owned(),
            |f| format!("the [[auth.keys]] of {}", f.display()),
        );
        match &self.file {
            Some(file) if self.config_file.is_some() => {
                format!("{} and {inline}", file.display())
            }
            Some(file) => file.display().to_string(),
            None => inline,
        }
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
        let ring = Self {
            keys: RwLock::new(Arc::new(Keys::default())),
            running: Mutex::default(),
        };
        ring.store(keys);
        ring
    }

    /// The keys in force (cheap: one `Arc` clone under a read lock).
    pub fn load(&self) -> Arc<Keys> {
        self.keys.read().expect("keys lock").clone()
    }

    /// The execution count of the tenant `name`: the one it has, else a new one.
    fn running_of(&self, name: &str) -> Arc<Running> {
        let mut running = self.running.lock().expect("running lock");
        if let Some(count) = running.get(name).and_then(Weak::upgrade) {
            return count;
        }
        let count = Arc::new(Running::default());
        running.insert(name.to_owned(), Arc::downgrade(&count));
        count
    }

    /// Reads the keys of `config` (a re-read configuration: its keys file and its inline
    /// keys, from `config_file`), checked as at start (a keys file that is missing, does
    /// not parse or holds no key is an error, as are entries that do not check), and says
    /// what differs from the keys in force. Installs nothing: see [`Self::store`]. `None`
    /// when the service runs without keys and `config` has none either. A configuration
    /// with no key left, or with keys for a service started without, is an error: a
    /// reload never turns authentication off or on. Every tenant keeps its running
    /// executions' count, whatever changed in its entry; one whose key, limits and scopes
    /// are unchanged is the very same `Tenant`.
    pub fn reread(
        &self,
        config: &AuthConfig,
        config_file: Option<&Path>,
    ) -> Result<Option<(Keys, KeysChange)>, KeysError> {
        let current = self.load();
        let configured = config.keys_file.is_some() || !config.keys.is_empty();
        match (current.enabled(), configured) {
            (false, false) => return Ok(None),
            (false, true) => return Err(KeysError::WouldTurnOn),
            (true, false) => return Err(KeysError::NoneLeft),
            (true, true) => {}
        }
        let mut next = Keys::load_counting(config, |name| self.running_of(name))?;
        next.loopback = current.loopback;
        let mut change = KeysChange {
            file: config.keys_file.clone(),
            config_file: (next.inline || current.inline)
                .then(|| config_file.map(Path::to_path_buf))
                .flatten(),
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
        let mut running = self.running.lock().expect("running lock");
        for tenant in &keys.tenants {
            running.insert(tenant.name.clone(), Arc::downgrade(&tenant.running));
        }
        // Names neither in force nor running anything are forgotten.
        running.retain(|_, count| count.strong_count() > 0);
        *self.keys.write().expect("keys lock") = Arc::new(keys);
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
        let (keys, change) = ring.reread(&config, None).unwrap().unwrap();
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
        let err = ring.reread(&config, None).unwrap_err();
        assert!(err.to_string().contains("clés.toml"), "{err}");
        std::fs::write(&path, "# every key was removed\n").unwrap();
        let err = ring.reread(&config, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds no keys; add one with `snakecage keys add`"),
            "{err}"
        );
        assert_eq!(ring.load().tenant(&carol).unwrap().name, "carol");
    }

    #[test]
    fn a_tenant_keeps_its_running_count_whatever_a_reload_changes_in_its_entry() {
        let mut file = KeysFile::default();
        let erin = file
            .add(
                "erin",
                KeyEntry {
                    max_concurrent: Some(1),
                    max_sessions: Some(1),
                    ..KeyEntry::default()
                },
            )
            .unwrap();
        let inline = |keys: &[KeyEntry]| AuthConfig {
            keys: keys.to_vec(),
            ..AuthConfig::default()
        };
        let ring = KeyRing::new(Keys::load(&inline(&file.keys)).unwrap());
        let running = ring.load().tenant(&erin).unwrap().execution_slot().unwrap();
        assert!(ring.load().tenant(&erin).unwrap().execution_slot().is_err());

        // Only max_sessions changed: still one running, against a limit of one.
        let mut entry = file.keys[0].clone();
        entry.max_sessions = Some(2);
        let (keys, change) = ring
            .reread(&inline(&[entry.clone()]), None)
            .unwrap()
            .unwrap();
        assert_eq!(change.changed, ["erin"]);
        ring.store(keys);
        let err = ring
            .load()
            .tenant(&erin)
            .unwrap()
            .execution_slot()
            .unwrap_err();
        assert!(
            err.to_string().contains("already has 1 executions running"),
            "{err}"
        );

        // A new secret for the same name is the same tenant: the run of the old one counts.
        let rotated = crate::auth::generate_key().unwrap();
        entry.sha256 = crate::auth::sha256_hex(&rotated);
        entry.max_concurrent = Some(2);
        let (keys, _) = ring
            .reread(&inline(&[entry.clone()]), None)
            .unwrap()
            .unwrap();
        ring.store(keys);
        assert!(ring.load().tenant(&erin).is_none());
        let second = ring
            .load()
            .tenant(&rotated)
            .unwrap()
            .execution_slot()
            .unwrap();
        assert!(
            ring.load()
                .tenant(&rotated)
                .unwrap()
                .execution_slot()
                .is_err()
        );

        // Lowered below what runs: nothing stops, new runs wait until under the limit.
        entry.max_concurrent = Some(1);
        let (keys, _) = ring
            .reread(&inline(&[entry.clone()]), None)
            .unwrap()
            .unwrap();
        ring.store(keys);
        let err = ring
            .load()
            .tenant(&rotated)
            .unwrap()
            .execution_slot()
            .unwrap_err();
        assert!(
            err.to_string().contains(
                "already has 2 executions running, more than its max_concurrent limit of 1 \
                 (lowered while they ran); retry when 2 of them have finished"
            ),
            "{err}"
        );
        drop(second);
        assert!(
            ring.load()
                .tenant(&rotated)
                .unwrap()
                .execution_slot()
                .is_err()
        );

        // Removed, then added back while its run still goes: that run still counts.
        let mut others = KeysFile::default();
        others.add("zoe", KeyEntry::default()).unwrap();
        let (keys, change) = ring.reread(&inline(&others.keys), None).unwrap().unwrap();
        assert_eq!(change.removed, ["erin"]);
        ring.store(keys);
        let (keys, change) = ring
            .reread(&inline(&[others.keys[0].clone(), entry]), None)
            .unwrap()
            .unwrap();
        assert_eq!(change.added, ["erin"]);
        ring.store(keys);
        assert!(
            ring.load()
                .tenant(&rotated)
                .unwrap()
                .execution_slot()
                .is_err()
        );
        drop(running);
        let _third = ring
            .load()
            .tenant(&rotated)
            .unwrap()
            .execution_slot()
            .unwrap();
    }

    #[test]
    fn inline_keys_are_reread_and_a_reread_never_turns_keys_off_or_on() {
        let mut file = KeysFile::default();
        let alice = file.add("alice", KeyEntry::default()).unwrap();
        let bob = file.add("bob", KeyEntry::default()).unwrap();
        let inline = |keys: &[KeyEntry]| AuthConfig {
            keys: keys.to_vec(),
            ..AuthConfig::default()
        };
        let toml = Path::new("/etc/snakecage/snakecage.toml");
        let ring = KeyRing::new(Keys::load(&inline(&file.keys[..1])).unwrap());

        let faster = KeyEntry {
            max_concurrent: Some(4),
            ..file.keys[0].clone()
        };
        let (keys, change) = ring
            .reread(&inline(&[faster, file.keys[1].clone()]), Some(toml))
            .unwrap()
            .unwrap();
        assert_eq!(
            (change.added, change.changed),
            (vec!["bob".to_owned()], vec!["alice".to_owned()])
        );
        assert_eq!(change.config_file.as_deref(), Some(toml));
        assert_eq!(change.file, None);
        ring.store(keys);
        assert_eq!(ring.load().tenant(&alice).unwrap().max_concurrent, Some(4));
        assert!(ring.load().tenant(&bob).is_some());

        let err = ring.reread(&inline(&[]), Some(toml)).unwrap_err();
        assert!(matches!(err, KeysError::NoneLeft), "{err}");
        let mut broken = file.keys.clone();
        broken[1].sha256 = "pas-un-hash".into();
        let err = ring.reread(&inline(&broken), Some(toml)).unwrap_err();
        assert!(err.to_string().contains("API key \"bob\""), "{err}");
        assert!(ring.load().tenant(&bob).is_some());

        let without = KeyRing::new(Keys::default());
        assert!(without.reread(&inline(&[]), Some(toml)).unwrap().is_none());
        let err = without.reread(&inline(&file.keys), Some(toml)).unwrap_err();
        assert!(matches!(err, KeysError::WouldTurnOn), "{err}");
    }
}
