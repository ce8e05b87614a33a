//! What a configuration that cannot be loaded is, in words that say what to give: a
//! `--config` path that is no file, a `listen` address that is no IP address and port, and
//! figment's errors with the key named as the user writes it.

use std::net::SocketAddr;
use std::path::Path;

use super::ConfigError;

/// Refuses a `--config` path that cannot be a configuration file, saying what it is. Any
/// readable file goes (an empty one, `/dev/null` too, is valid TOML with no keys).
pub(super) fn check_config_file(file: &Path) -> Result<(), ConfigError> {
    let refuse = |what: String| {
        Err(ConfigError::Invalid(format!(
            "config file {}: {what}; give the path of a TOML file (snakecage.example.toml \
             lists every key)",
            file.display()
        )))
    };
    match std::fs::metadata(file) {
        Ok(meta) if meta.is_dir() => refuse("is a directory".into()),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => refuse("not found".into()),
        Err(e) => refuse(format!("cannot be read: {e}")),
    }
}

/// A load error, with what to write instead where the parser's own words do not say it.
pub(super) fn explain_load_error(error: figment::Error) -> ConfigError {
    if error.path == ["listen"] {
        return ConfigError::Invalid(format!(
            "listen: {}: {LISTEN_HINT}",
            load_error_text(&error)
        ));
    }
    ConfigError::Load(Box::new(error))
}

/// A figment error, each of its chain on a line, as figment words it but for the key: as
/// written in the file (`pool.sise`, not figment's `default.pool.sise`, whose `default` is
/// a profile we do not use) or as the environment variable set (`SNAKECAGE_POOL__SIZE`),
/// and a list of expected names quoted once (figment quotes it twice).
pub(super) fn load_error_text(error: &figment::Error) -> String {
    error
        .clone()
        .into_iter()
        .map(|e| one_error_text(&e))
        .collect::<Vec<_>>()
        .join("\n")
}

fn one_error_text(error: &figment::Error) -> String {
    use figment::error::Kind;
    let mut text = match &error.kind {
        Kind::UnknownField(found, expected) => {
            format!(
                "unknown field: found `{found}`, expected {}",
                one_of(expected)
            )
        }
        Kind::UnknownVariant(found, expected) => {
            format!(
                "unknown variant: found `{found}`, expected {}",
                one_of(expected)
            )
        }
        kind => in_words(&kind.to_string()),
    };
    let from_env = error
        .metadata
        .as_ref()
        .is_some_and(|md| md.name.ends_with("environment variable(s)"));
    if !error.path.is_empty() {
        if from_env {
            text.push_str(&format!(" in {}", variables_of(&error.path)));
            return text;
        }
        text.push_str(&format!(" for key {:?}", error.path.join(".")));
    }
    if let Some(md) = &error.metadata {
        match &md.source {
            Some(source) => text.push_str(&format!(" in {source} {}", md.name)),
            None => text.push_str(&format!(" in {}", md.name)),
        }
    }
    text
}

/// The environment variables set for the key at `path` or below it, as set: an unknown
/// section (`SNAKECAGE_POOLS__SIZE`) is reported by figment at the section, whose own
/// name no one set.
fn variables_of(path: &[String]) -> String {
    let key = format!("{}{}", super::ENV_PREFIX, path.join("__")).to_ascii_uppercase();
    let mut set: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            let upper = name.to_ascii_uppercase();
            upper == key
                || upper
                    .strip_prefix(&key)
                    .is_some_and(|rest| rest.starts_with("__"))
        })
        .collect();
    set.sort();
    match set.as_slice() {
        [] => format!("environment variable {key}"),
        [one] => format!("environment variable {one}"),
        many => format!("environment variables {}", many.join(", ")),
    }
}

/// A parser's message with Rust's type names (`expected usize`) in words.
fn in_words(text: &str) -> String {
    const TYPES: [(&str, &str); 11] = [
        ("usize", "a whole number, 0 or more"),
        ("u64", "a whole number, 0 or more"),
        ("u32", "a whole number, 0 or more"),
        ("u16", "a whole number from 0 to 65535"),
        ("u8", "a whole number from 0 to 255"),
        ("isize", "a whole number"),
        ("i64", "a whole number"),
        ("i32", "a whole number"),
        ("f64", "a number"),
        ("f32", "a number"),
        ("bool", "true or false"),
    ];
    for (name, words) in TYPES {
        let rust = format!("expected {name}");
        if let Some(head) = text.strip_suffix(&rust) {
            return format!("{head}expected {words}");
        }
    }
    text.to_owned()
}

/// `` `a` ``, `` `a` or `b` ``, `` one of `a`, `b`, `c` ``.
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [] => "none".to_owned(),
        [one] => one.clone(),
        [a, b] => format!("{a} or {b}"),
        many => format!("one of {}", many.join(", ")),
    }
}

/// What `listen` (and `--listen`) takes.
pub const LISTEN_HINT: &str = "give an IP address and port, e.g. 127.0.0.1:8000 (a host name such as localhost is not \
     resolved; 0.0.0.0:8000 listens on every interface)";

/// `--listen`: a socket address, or an error that says what to give.
pub(super) fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|e| {
        // std says "invalid socket address syntax" for a port out of range too.
        let port = value
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u64>().ok());
        match port {
            Some(port) if port > u64::from(u16::MAX) => {
                format!("the port {port} is out of range (0 to 65535): {LISTEN_HINT}")
            }
            _ => format!("{e}: {LISTEN_HINT}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Config, Overrides};
    use super::*;

    #[test]
    fn a_config_path_that_is_no_file_and_a_host_name_to_listen_on_are_explained() {
        let dir = tempfile::tempdir().unwrap();
        let load = |file: &Path| match Config::load(Some(file), &Overrides::default()) {
            Ok(_) => "accepted".to_owned(),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            load(dir.path()),
            format!(
                "configuration: config file {}: is a directory; give the path of a TOML file \
                 (snakecage.example.toml lists every key)",
                dir.path().display()
            )
        );
        let missing = dir.path().join("réglages.toml");
        assert_eq!(
            load(&missing),
            format!(
                "configuration: config file {}: not found; give the path of a TOML file \
                 (snakecage.example.toml lists every key)",
                missing.display()
            )
        );
        // An empty file is valid TOML without keys: the defaults.
        assert_eq!(load(Path::new("/dev/null")), "accepted");
        let file = dir.path().join("snakecage.toml");
        std::fs::write(&file, "listen = \"localhost:8000\"\n").unwrap();
        let error = load(&file);
        assert!(
            error.starts_with("configuration: listen: invalid socket address syntax"),
            "{error}"
        );
        assert!(error.ends_with(LISTEN_HINT), "{error}");
        assert_eq!(
            parse_listen("localhost:8000").unwrap_err(),
            format!("invalid socket address syntax: {LISTEN_HINT}")
        );
    }
}
