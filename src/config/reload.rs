//! Which configuration keys a running service can take without a restart (a new zygote
//! generation picks them up: the interpreter, the allowlist, the tiers, the limits), which
//! changed keys are not among them, and whether two configurations differ at all.

use serde_json::Value;

use super::Config;

/// The sections (or keys) a reload applies. Everything else (the listen address,
/// `worker.*`, the file store, sessions, the keys file's path, the pool's size ...) is
/// read once at start.
pub const RELOADABLE: &[&str] = &["python", "sandbox", "tiers", "limits"];

/// Keys a reload applies by itself, not through a new generation: the inline API keys
/// (`[[auth.keys]]`), which replace the keys in force (see `crate::auth::KeyRing`). A
/// change to them alone starts no generation.
pub const APPLIED_APART: &[&str] = &["auth.keys"];

/// Keys that are fixed once the router is built (or, the worker uids and the instance's
/// cgroup, claimed and made at start),
/// even inside a reloadable section.
const FIXED_WITHIN: &[&str] = &[
    "limits.client_timeout_ms",
    "limits.max_request_bytes",
    "limits.max_total_memory_mb",
    "limits.max_total_processes",
    "sandbox.uid",
    "sandbox.uid_count",
];

/// The dotted keys whose value differs between `old` and `new` and that a reload cannot
/// apply, sorted.
pub fn unreloadable_changes(old: &Config, new: &Config) -> Vec<String> {
    let old = serde_json::to_value(old).unwrap_or(Value::Null);
    let new = serde_json::to_value(new).unwrap_or(Value::Null);
    let mut changed = Vec::new();
    diff("", &old, &new, &mut changed);
    changed.retain(|key| {
        if within(key, APPLIED_APART) {
            return false;
        }
        let section = key.split('.').next().unwrap_or(key);
        within(key, FIXED_WITHIN) || !RELOADABLE.contains(&section)
    });
    changed.sort();
    changed.dedup();
    changed
}

/// Whether the dotted `key` is one of `keys` or inside one.
fn within(key: &str, keys: &[&str]) -> bool {
    keys.iter()
        .any(|k| key == *k || key.starts_with(&format!("{k}.")))
}

/// Whether `a` and `b` set every key alike (compared as data, as a reload reads them),
/// but those a reload applies apart ([`APPLIED_APART`]): a generation does not depend
/// on them.
pub fn same_settings(a: &Config, b: &Config) -> bool {
    let (Some(a), Some(b)) = (generation_settings(a), generation_settings(b)) else {
        return false;
    };
    a == b
}

/// `config` as data, without the keys of [`APPLIED_APART`].
fn generation_settings(config: &Config) -> Option<Value> {
    let mut value = serde_json::to_value(config).ok()?;
    for key in APPLIED_APART {
        let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
        let table = parent
            .split('.')
            .filter(|p| !p.is_empty())
            .try_fold(&mut value, |v, p| v.get_mut(p))
            .and_then(Value::as_object_mut);
        if let Some(table) = table {
            table.remove(last);
        }
    }
    Some(value)
}

/// Collects the dotted paths where `a` and `b` differ (a table's keys one by one; any
/// other value as a whole).
fn diff(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys()) {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                let null = Value::Null;
                diff(
                    &path,
                    a.get(key).unwrap_or(&null),
                    b.get(key).unwrap_or(&null),
                    out,
                );
            }
        }
        (a, b) if a != b => out.push(prefix.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_a_reload_cannot_apply_are_named() {
        let old = Config::default();
        let mut new = old.clone();
        new.sandbox.allowed_packages.push("tabulate".into());
        new.limits.memory_limit_mb += 1;
        assert!(unreloadable_changes(&old, &new).is_empty());
        assert!(same_settings(&old, &old.clone()));
        assert!(!same_settings(&old, &new));
        new.listen = "127.0.0.1:9999".parse().unwrap();
        new.worker.state_dir = "/elsewhere".into();
        new.limits.max_request_bytes += 1;
        assert_eq!(
            unreloadable_changes(&old, &new),
            ["limits.max_request_bytes", "listen", "worker.state_dir"]
        );
    }

    #[test]
    fn inline_keys_are_applied_apart_and_the_rest_of_auth_is_not() {
        let old = Config::default();
        let mut new = old.clone();
        new.auth.keys.push(crate::auth::KeyEntry {
            name: "alice".into(),
            sha256: "ab".repeat(32),
            ..Default::default()
        });
        assert!(unreloadable_changes(&old, &new).is_empty());
        assert!(
            same_settings(&old, &new),
            "no new generation for keys alone"
        );
        new.auth.keys_file = Some("/etc/snakecage/keys.toml".into());
        new.auth.public_metrics = !old.auth.public_metrics;
        assert_eq!(
            unreloadable_changes(&old, &new),
            ["auth.keys_file", "auth.public_metrics"]
        );
        assert!(!same_settings(&old, &new));
    }
}
