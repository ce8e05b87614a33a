//! Configurations the service cannot work with are refused at start-up, before anything
//! starts, with a message that names the key and says what to give instead.

use std::process::Command;
use std::time::Duration;

use crate::harness::{refused_start, repo_root};

/// Starts the binary with `args` and `env` and returns what it printed to stderr: it must
/// refuse to start (exit code 2, the configuration's), and a binary that starts instead is
/// stopped and fails the test.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_snakecage"));
    // `--listen` would override the address a test gives in the environment; a flag the
    // test gives is its own.
    if !env.iter().any(|(key, _)| *key == "SNAKECAGE_LISTEN") && !args.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    if !args.contains(&"--venv") {
        cmd.arg("--venv").arg(repo_root().join(".venv"));
    }
    cmd.args(args).envs(env.iter().copied());
    let (status, stderr) = refused_start(cmd, Duration::from_secs(60));
    assert_eq!(status.code(), Some(2), "{stderr}");
    stderr
}

#[test]
fn a_zero_that_would_break_every_run_is_refused_naming_the_key() {
    let stderr = refused(&[], &[("SNAKECAGE_LIMITS__MAX_OUTPUT_BYTES", "0")]);
    assert_eq!(
        stderr,
        "snakecage: configuration: limits.max_output_bytes is 0 but must be at least 1024 \
         (below it every run's output would be cut to nothing); raise it in the configuration \
         file or SNAKECAGE_LIMITS__MAX_OUTPUT_BYTES\n"
    );
}

#[test]
fn more_tool_calls_at_once_than_the_worker_can_start_threads_for_is_refused_naming_the_key() {
    let stderr = refused(&[], &[("SNAKECAGE_TOOLS__MAX_CONCURRENT_CALLS", "65")]);
    assert_eq!(
        stderr,
        "snakecage: configuration: tools.max_concurrent_calls is 65 but may be at most 64 (each \
         call in flight of an asyncio program has a thread in the worker, whose stack counts \
         against the run's memory limit); lower it in the configuration file or \
         SNAKECAGE_TOOLS__MAX_CONCURRENT_CALLS\n"
    );
}

#[test]
fn a_total_process_bound_too_small_for_the_workers_is_refused_naming_the_key() {
    let stderr = refused(
        &[],
        &[
            ("SNAKECAGE_POOL__SIZE", "1"),
            ("SNAKECAGE_SESSIONS__MAX_SESSIONS", "3"),
            ("SNAKECAGE_TIERS__MIN_IDLE", "0"),
            ("SNAKECAGE_TIERS__PROFILE", r#"[{name = "bare"}]"#),
            ("SNAKECAGE_LIMITS__MAX_PROCESSES", "40"),
            ("SNAKECAGE_LIMITS__MAX_TOTAL_PROCESSES", "51"),
        ],
    );
    assert_eq!(
        stderr,
        "snakecage: configuration: limits.max_total_processes is 51 but must be at least 52: up \
         to 12 workers can be alive at once, each a process of the instance's cgroup, and one \
         of them may start limits.max_processes (40) threads; raise it or leave it unset\n"
    );
}

#[test]
fn a_directory_given_as_the_config_file_is_called_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("réglages");
    std::fs::create_dir(&config).unwrap();
    let stderr = refused(&["--config", config.to_str().unwrap()], &[]);
    assert_eq!(
        stderr,
        format!(
            "snakecage: configuration: config file {}: is a directory; give the path of a TOML \
             file (snakecage.example.toml lists every key)\n",
            config.display()
        )
    );
}

#[test]
fn a_host_name_to_listen_on_gets_an_example_of_what_works() {
    let stderr = refused(&[], &[("SNAKECAGE_LISTEN", "localhost:8000")]);
    assert!(
        stderr.starts_with("snakecage: configuration: listen: invalid socket address syntax"),
        "{stderr}"
    );
    assert!(
        stderr.ends_with(
            ": give an IP address and port, e.g. 127.0.0.1:8000 (a host name such \
             as localhost is not resolved; 0.0.0.0:8000 listens on every interface)\n"
        ),
        "{stderr}"
    );
}

#[test]
fn a_site_packages_entry_that_does_not_exist_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("paquets-absents");
    let value = format!("[{:?}]", missing.display().to_string());
    let stderr = refused(&[], &[("SNAKECAGE_PYTHON__SITE_PACKAGES", &value)]);
    assert_eq!(
        stderr,
        format!(
            "snakecage: configuration: python.site_packages entry {} does not exist; give \
             directories of importable modules\n",
            missing.display()
        )
    );
}

#[test]
fn a_misspelt_key_and_a_bad_value_are_named_as_the_user_wrote_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    std::fs::write(&config, "[pool]\nsise = 3\n").unwrap();
    let stderr = refused(&["--config", config.to_str().unwrap()], &[]);
    // The key as written (figment would say "default.pool.sise", its profile first), and
    // the names it takes quoted once each.
    assert!(
        stderr.starts_with(
            "snakecage: configuration: unknown field: found `sise`, expected one of `size`, \
             `queue_length`, `queue_timeout_ms`, `spawn_timeout_ms` for key \"pool.sise\" in "
        ) && stderr.ends_with("snakecage.toml TOML file\n"),
        "{stderr}"
    );
    // From the environment: the variable as set.
    let stderr = refused(&[], &[("SNAKECAGE_LOG__FORMAT", "xml")]);
    assert_eq!(
        stderr,
        "snakecage: configuration: unknown variant: found `xml`, expected `human` or `json` in \
         environment variable SNAKECAGE_LOG__FORMAT\n"
    );
}

/// Values of the wrong type say what to give in words, not in Rust's type names; a key of
/// an unknown section names the variable that was set; a port out of range says so; a
/// venv that is not one is refused like every other configuration (exit code 2, one line).
#[test]
fn wrong_types_unknown_sections_ports_and_venvs_are_named_as_the_user_gave_them() {
    let stderr = refused(&[], &[("SNAKECAGE_POOL__SIZE", "abc")]);
    assert_eq!(
        stderr,
        "snakecage: configuration: invalid type: found string \"abc\", expected a whole \
         number, 0 or more in environment variable SNAKECAGE_POOL__SIZE\n"
    );
    let stderr = refused(&[], &[("SNAKECAGE_LIMITS__MEMORY_LIMIT_MB", "-5")]);
    assert!(
        stderr.ends_with(
            "expected a whole number, 0 or more in environment variable \
             SNAKECAGE_LIMITS__MEMORY_LIMIT_MB\n"
        ),
        "{stderr}"
    );
    let stderr = refused(&[], &[("SNAKECAGE_POOLS__SIZE", "3")]);
    assert!(
        stderr.starts_with("snakecage: configuration: unknown field: found `pools`")
            && stderr.ends_with(" in environment variable SNAKECAGE_POOLS__SIZE\n"),
        "{stderr}"
    );
    let stderr = refused(&["--listen", "127.0.0.1:99999"], &[]);
    assert!(
        stderr.contains("the port 99999 is out of range (0 to 65535): give an IP address"),
        "{stderr}"
    );
    let missing = tempfile::tempdir().unwrap().path().join("pas-de-venv");
    let stderr = refused(&["--venv", missing.to_str().unwrap()], &[]);
    assert_eq!(
        stderr,
        format!(
            "snakecage: configuration: python.venv {}: cannot read {}/pyvenv.cfg: No such file \
             or directory (os error 2) (create it with the README's first command, or set \
             python.venv)\n",
            missing.display(),
            missing.display()
        )
    );
}

/// A `workspace.size_mb` above what the host has (its RAM, where the tmpfs lives) would
/// bound nothing: the service refuses to start, saying the numbers and what to set.
#[test]
fn a_workspace_bound_larger_than_the_host_is_refused_at_start() {
    let stderr = refused(&[], &[("SNAKECAGE_WORKSPACE__SIZE_MB", "100000000")]);
    let ram_mb = nix::sys::sysinfo::sysinfo().unwrap().ram_total() >> 20;
    // The last line, after what the log said while starting.
    let refusal = stderr.lines().last().unwrap_or_default();
    assert!(
        refusal.starts_with(&format!(
            "snakecage: configuration: workspace.size_mb is 100000000 but this host has \
             {ram_mb} MB of RAM (the workspaces' tmpfs lives in memory) and the file system of "
        )),
        "{stderr}"
    );
    assert!(
        refusal.contains(" MB: set workspace.size_mb to at most "),
        "{stderr}"
    );
}
