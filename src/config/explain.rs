//! What a configuration that cannot be loaded is, in words that say what to give: a
//! `--config` path that is no file, a `listen` address that is no IP address and port.

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
        return ConfigError::Invalid(format!("listen: {error}: {LISTEN_HINT}"));
    }
    ConfigError::Load(Box::new(error))
}

/// What `listen` (and `--listen`) takes.
pub const LISTEN_HINT: &str = "give an IP address and port, e.g. 127.0.0.1:8000 (a host name such as localhost is not \
     resolved; 0.0.0.0:8000 listens on every interface)";

/// `--listen`: a socket address, or an error that says what to give.
pub(super) fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|e| format!("{e}: {LISTEN_HINT}"))
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
