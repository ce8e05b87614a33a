//! Which configuration keys a running service can take without a restart (a new zygote
//! generation picks them up: the interpreter, the allowlist, the tiers, the limits), which
//! changed keys are not among them, and whether two configurations differ at all.

use serde_json::Value;

use super::Config;

/// The sections (or keys) a reload applies. Everything else (the listen address,
/// `worker.*`, the file store, sessions, keys, the pool's size ...) is read once at start.
pub const RELOADABLE: &[&str] = &["python", "sandbox", "tiers", "limits"];

/// Keys that are fixed once the router is built, even inside a reloadable section.
const FIXED_WITHIN: &[&str] = &["limits.max_request_bytes"];

/// The dotted keys whose value differs between `old` and `new` and that a reload cannot
/// apply, sorted.
pub fn unreloadable_changes(old: &Config, new: &Config) -> Vec<String> {
    let old = serde_json::to_value(old).unwrap_or(Value::Null);
    let new = serde_json::to_value(new).unwrap_or(Value::Null);
    let mut changed = Vec::new();
    diff("", &old, &new, &mut changed);
    changed.retain(|key| {
        let section = key.split('.').next().unwrap_or(key);
        let fixed = FIXED_WITHIN
            .iter()
            .any(|f| key == f || key.starts_with(&format!("{f}.")));
        fixed || !RELOADABLE.contains(&section)
    });
    changed.sort();
    changed.dedup();
    changed
}

/// Whether `a` and `b` set every key alike (compared as data, as a reload reads them).
pub fn same_settings(a: &Config, b: &Config) -> bool {
    let a = serde_json::to_value(a).unwrap_or(Value::Null);
    let b = serde_json::to_value(b).unwrap_or(Value::Null);
    !a.is_null() && a == b
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
}
