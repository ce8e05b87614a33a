//! The hostile suite with the Python layer switched off: the same attacks meet the OS
//! layers (seccomp, Landlock, namespaces, rlimits, the uid drop), the real boundary.

use super::host::{HostBait, assert_unharmed};
use super::{assert_os_layers_stop_every_escape, python_layer_off};
use crate::harness::Server;

#[tokio::test]
async fn with_the_python_layer_off_the_os_layers_still_stop_every_escape() {
    let bait = HostBait::new();
    let s = Server::start_with(python_layer_off()).await;
    let health = s.health().await;
    assert_eq!(health["sandbox"]["audit_hook"]["state"], "off", "{health}");
    assert!(
        s.log().contains("SANDBOX LAYER SWITCHED OFF"),
        "switching a layer off must be logged loudly"
    );
    let zygote_pid = health["pool"]["zygote"]["pid"].clone();

    assert_os_layers_stop_every_escape(&s, &bait).await;

    assert_unharmed(&s, &zygote_pid, &bait).await;
}
