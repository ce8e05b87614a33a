//! The least value of each numeric key below which the service cannot work (every run
//! cut to nothing, every request refused, every spawn timed out), refused at start-up and
//! in a reload with the key, its value and the minimum.

use super::{Config, FilesBackend};

/// One key's value and its minimum, with why a smaller one does not work.
struct Minimum {
    key: &'static str,
    value: u64,
    least: u64,
    why: &'static str,
}

/// The keys with a minimum of their own; [`Config::validate`] checks the others (those
/// bound to another key, or with a message of their own).
fn minimums(c: &Config) -> Vec<Minimum> {
    let m = |key, value: u64, least, why| Minimum {
        key,
        value,
        least,
        why,
    };
    let mut all = vec![
        m(
            "pool.queue_timeout_ms",
            c.pool.queue_timeout_ms,
            100,
            "a request that waits even briefly for a worker would get 503",
        ),
        m(
            "pool.spawn_timeout_ms",
            c.pool.spawn_timeout_ms,
            1000,
            "zygotes and workers need this long to start",
        ),
        m(
            "limits.max_output_bytes",
            c.limits.max_output_bytes as u64,
            1024,
            "every run's output would be cut to nothing",
        ),
        m(
            "limits.max_request_bytes",
            c.limits.max_request_bytes as u64,
            1024,
            "every run request would get 413",
        ),
        m(
            "limits.max_file_size_mb",
            c.limits.max_file_size_mb,
            1,
            "every file a run writes would be cut to 0 bytes",
        ),
        m(
            "workspace.max_total_mb",
            c.workspace.max_total_mb,
            1,
            "no file a run writes would be stored",
        ),
        m(
            "cluster.forward_connect_timeout_ms",
            c.cluster.forward_connect_timeout_ms,
            10,
            "no call could be forwarded to its replica",
        ),
        m(
            "tools.max_concurrent_calls",
            u64::from(c.tools.max_concurrent_calls),
            1,
            "no tool call could ever be made",
        ),
    ];
    if c.files.backend == FilesBackend::S3 {
        all.push(m(
            "s3.connect_timeout_ms",
            c.s3.connect_timeout_ms,
            100,
            "the object store could not be reached",
        ));
        all.push(m(
            "s3.request_timeout_ms",
            c.s3.request_timeout_ms,
            1000,
            "no file could be stored or read",
        ));
    }
    all
}

/// The first key below its minimum, as a message that says what to set.
pub(super) fn problem(c: &Config) -> Option<String> {
    let low = minimums(c).into_iter().find(|m| m.value < m.least)?;
    let env = format!("SNAKECAGE_{}", low.key.to_uppercase().replace('.', "__"));
    Some(format!(
        "{} is {} but must be at least {} (below it {}); raise it in the configuration file \
         or {env}",
        low.key, low.value, low.least, low.why
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message for `c`, which must be refused.
    fn refused(c: &Config) -> String {
        match c.validate() {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted"),
        }
    }

    #[test]
    fn zero_is_refused_for_each_key_that_breaks_the_service_naming_it() {
        type Set = fn(&mut Config);
        let cases: [(&str, Set, &str); 8] = [
            (
                "pool.queue_timeout_ms",
                |c| c.pool.queue_timeout_ms = 0,
                "100",
            ),
            (
                "pool.spawn_timeout_ms",
                |c| c.pool.spawn_timeout_ms = 0,
                "1000",
            ),
            (
                "limits.max_output_bytes",
                |c| c.limits.max_output_bytes = 0,
                "1024",
            ),
            (
                "limits.max_request_bytes",
                |c| c.limits.max_request_bytes = 0,
                "1024",
            ),
            (
                "limits.max_file_size_mb",
                |c| c.limits.max_file_size_mb = 0,
                "1",
            ),
            (
                "workspace.max_total_mb",
                |c| c.workspace.max_total_mb = 0,
                "1",
            ),
            (
                "cluster.forward_connect_timeout_ms",
                |c| c.cluster.forward_connect_timeout_ms = 0,
                "10",
            ),
            (
                "tools.max_concurrent_calls",
                |c| c.tools.max_concurrent_calls = 0,
                "1",
            ),
        ];
        for (key, set, least) in cases {
            let mut c = Config::default();
            set(&mut c);
            let env = format!("SNAKECAGE_{}", key.to_uppercase().replace('.', "__"));
            assert!(
                refused(&c).starts_with(&format!(
                    "configuration: {key} is 0 but must be at least {least} (below it "
                )),
                "{key}: {}",
                refused(&c)
            );
            assert!(refused(&c).ends_with(&env), "{key}: {}", refused(&c));
        }
    }

    #[test]
    fn the_minimum_itself_is_accepted_and_s3_timeouts_count_only_with_s3() {
        let mut c = Config::default();
        c.pool.queue_timeout_ms = 100;
        c.pool.spawn_timeout_ms = 1000;
        c.limits.max_output_bytes = 1024;
        c.limits.max_request_bytes = 1024;
        c.limits.max_file_size_mb = 1;
        c.workspace.max_total_mb = 1;
        c.cluster.forward_connect_timeout_ms = 10;
        c.tools.max_concurrent_calls = 1;
        c.s3.request_timeout_ms = 0;
        c.validate().unwrap();
        c.files.backend = FilesBackend::S3;
        c.s3.bucket = "données".into();
        assert_eq!(
            refused(&c),
            "configuration: s3.request_timeout_ms is 0 but must be at least 1000 (below it no \
             file could be stored or read); raise it in the configuration file or \
             SNAKECAGE_S3__REQUEST_TIMEOUT_MS"
        );
    }

    #[test]
    fn a_reload_is_validated_alike() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("snakecage-é.toml");
        std::fs::write(&file, "[limits]\nmax_output_bytes = 2048\n").unwrap();
        let running = Config::load(Some(&file), &super::super::Overrides::default()).unwrap();
        assert_eq!(running.limits.max_output_bytes, 2048);
        std::fs::write(&file, "[limits]\nmax_output_bytes = 0\n").unwrap();
        let error = running.reload().unwrap_err().to_string();
        assert!(
            error.starts_with(
                "configuration: limits.max_output_bytes is 0 but must be at least 1024"
            ),
            "{error}"
        );
    }
}
