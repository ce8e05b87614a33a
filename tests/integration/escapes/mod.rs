//! Hostile fixtures: tiny programs written by someone who knows CPython's escape tricks.
//! Each one must be stopped with an exact denial that the user sees as a result (stderr,
//! exit code 1, verdict), never as a 5xx.
//!
//! Two servers. One with every layer on (and required): most fixtures meet the Python
//! layer first, the audit hook or the import guard, whose messages name what was denied.
//! One with the Python layer switched off: the same attacks meet the OS layers (seccomp,
//! Landlock, namespaces), which are the real boundary. After the hostile suite the
//! service is healthy, nothing it started is left behind and no file outside the
//! workspaces changed.
//!
//! Fixtures are grouped by attack family, each family with its Python-layer and OS-layer
//! variants: `process.rs`, `network.rs`, `filesystem.rs`, `interpreter.rs`,
//! `resources.rs`, `syscalls.rs`. `fixture.rs` runs them, `host.rs` holds the bait and
//! the checks on the host. The tests: `python_layer.rs`, `os_layers.rs`, `layers.rs`.

mod filesystem;
mod fixture;
mod host;
mod interpreter;
mod layers;
mod network;
mod os_layers;
mod process;
mod python_layer;
mod resources;
mod syscalls;
mod workspace_race;

pub(crate) use fixture::{ALL_LAYERS, Fixture, OS_LAYERS, run_fixtures};
pub(crate) use host::HostBait;

/// Every attack family against the Python layer (with the OS layers behind it).
fn python_layer_fixtures(bait: &HostBait, zygote_pid: i64) -> Vec<Fixture> {
    let secret = bait.secret();
    [
        process::python_layer(zygote_pid),
        network::python_layer(bait.port()),
        interpreter::python_layer(),
        filesystem::python_layer(&secret),
        resources::python_layer(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Every attack family against the OS layers alone (the Python layer switched off).
pub(crate) fn os_layer_fixtures(bait: &HostBait, supervisor_pid: u32) -> Vec<Fixture> {
    let secret = bait.secret();
    [
        process::os_layers(supervisor_pid),
        network::os_layers(bait.port()),
        filesystem::os_layers(&secret),
        syscalls::os_layers(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// A server with the Python layer (audit hook, import guard) switched off and every OS
/// layer required: what the OS-layer fixtures run against.
pub(crate) fn python_layer_off() -> crate::harness::Options {
    crate::harness::Options::default()
        .env("SNAKECAGE_SANDBOX__REQUIRE", OS_LAYERS)
        .env(
            "SNAKECAGE_SANDBOX__LAYERS_OFF",
            r#"["audit_hook", "import_guard"]"#,
        )
}

/// Runs every OS-layer fixture against `s`; fails naming each one that escaped or was
/// stopped differently.
pub(crate) async fn assert_os_layers_stop_every_escape(
    s: &crate::harness::Server,
    bait: &HostBait,
) {
    let failures = run_fixtures(s, os_layer_fixtures(bait, s.pid())).await;
    assert!(
        failures.is_empty(),
        "{} fixture(s) escaped the OS layers or were stopped differently:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
