//! Settings of the configuration file that an environment variable or a flag overrides:
//! a reload re-reads all three, so an edit of such a setting in the file changes nothing,
//! and the operator is told which source wins instead of "nothing changed".

use figment::Figment;
use figment::providers::{Format, Toml};
use serde_json::Value;

use super::{Config, ENV_IGNORED, ENV_PREFIX};

/// Each setting `config`'s file gives a value that the environment or a flag replaces:
/// `pool.size = 3 in /etc/snakecage.toml is overridden by --pool-size (2)`.
pub fn shadowed_settings(config: &Config) -> Vec<String> {
    let Some(file) = config.source.file.as_deref() else {
        return Vec::new();
    };
    let Ok(in_file) = Figment::from(Toml::file(file)).extract::<Value>() else {
        return Vec::new();
    };
    let Ok(effective) = serde_json::to_value(config) else {
        return Vec::new();
    };
    overriders(config)
        .into_iter()
        .filter_map(|(key, by)| {
            let file_value = lookup(&in_file, &key)?;
            let value = lookup(&effective, &key)?;
            (file_value != value).then(|| {
                format!(
                    "{key} = {file_value} in {} is overridden by {by} ({value})",
                    file.display()
                )
            })
        })
        .collect()
}

/// The settings the flags and `SNAKECAGE_*` variables set, with what sets each.
fn overriders(config: &Config) -> Vec<(String, String)> {
    let flags = &config.source.overrides;
    let mut out: Vec<(String, String)> = std::env::vars()
        .filter_map(|(name, _)| {
            let key = name.strip_prefix(ENV_PREFIX)?.to_ascii_lowercase();
            (!ENV_IGNORED.contains(&key.as_str())).then(|| (key.replace("__", "."), name))
        })
        .collect();
    let set = [
        ("listen", "--listen", flags.listen.is_some()),
        ("python.venv", "--venv", flags.venv.is_some()),
        ("pool.size", "--pool-size", flags.pool_size.is_some()),
        ("log.format", "--log-format", flags.log_format.is_some()),
        (
            "auth.allow_unauthenticated",
            "--allow-unauthenticated",
            flags.allow_unauthenticated,
        ),
    ];
    // A flag wins over a variable of the same setting: it is the one named.
    for (key, flag, given) in set {
        if given {
            out.retain(|(k, _)| k != key);
            out.push((key.to_owned(), flag.to_owned()));
        }
    }
    out.sort();
    out
}

fn lookup<'a>(value: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .try_fold(value, |value, part| value.as_object()?.get(part))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    #[test]
    fn a_file_setting_a_flag_replaces_is_named_with_both_values() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("réglages.toml");
        std::fs::write(&file, "[pool]\nsize = 3\n\n[sessions]\nmax_sessions = 9\n").unwrap();
        let overrides = Overrides {
            pool_size: Some(2),
            ..Overrides::default()
        };
        let config = Config::load(Some(&file), &overrides).unwrap();
        assert_eq!(
            shadowed_settings(&config),
            [format!(
                "pool.size = 3 in {} is overridden by --pool-size (2)",
                file.display()
            )]
        );
        // The same value from both sources shadows nothing worth saying.
        let same = Overrides {
            pool_size: Some(3),
            ..Overrides::default()
        };
        let config = Config::load(Some(&file), &same).unwrap();
        assert!(shadowed_settings(&config).is_empty());
        // No flag: the file's value is in force.
        let config = Config::load(Some(&file), &Overrides::default()).unwrap();
        assert!(shadowed_settings(&config).is_empty());
    }
}
