//! The hostile suite with the Python layer switched off: the same attacks meet the OS
//! layers (seccomp, Landlock, namespaces, rlimits, the uid drop), the real boundary.

use super::fixture::{OS_LAYERS, run_fixtures};
use super::host::{HostBait, assert_unharmed};
use super::os_layer_fixtures;
use crate::harness::{Options, Server};

#[tokio::test]
async fn with_the_python_layer_off_the_os_layers_still_stop_every_escape() {
    let bait = HostBait::new();
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_SANDBOX__REQUIRE", OS_LAYERS)
            .env(
                "SNAKECAGE_SANDBOX__LAYERS_OFF",
                r#"["audit_hook", "import_guard"]"#,
            ),
    )
    .await;
    let health = s.health().await;
    assert_eq!(health["sandbox"]["audit_hook"]["state"], "off", "{health}");
    assert!(
        s.log().contains("SANDBOX LAYER SWITCHED OFF"),
        "switching a layer off must be logged loudly"
    );
    let zygote_pid = health["pool"]["zygote"]["pid"].clone();

    let failures = run_fixtures(&s, os_layer_fixtures(&bait, s.pid())).await;
    assert!(
        failures.is_empty(),
        "{} fixture(s) escaped the OS layers or were stopped differently:\n{}",
        failures.len(),
        failures.join("\n")
    );

    assert_unharmed(&s, &zygote_pid, &bait).await;
}
