//! What `/health` reports about each sandbox layer, and start-up refusing a layer that is
//! both required and switched off.

use serde_json::Value;

use crate::harness::Server;

#[tokio::test]
async fn health_reports_every_layer_and_requiring_a_switched_off_layer_fails_start_up() {
    let s = Server::start().await;
    let h = s.health().await;
    let sandbox = h["sandbox"].as_object().expect("sandbox in /health");
    for layer in [
        "network_namespace",
        "mount_namespace",
        "rlimits",
        "drop_privileges",
        "no_new_privs",
        "landlock",
        "seccomp",
        "audit_hook",
        "import_guard",
        "cgroup",
    ] {
        let state = &sandbox[layer]["state"];
        assert!(
            matches!(state, Value::String(s) if ["active", "off", "unavailable"].contains(&s.as_str())),
            "{layer}: {state}"
        );
        assert!(sandbox[layer]["detail"].is_string(), "{layer}");
    }
    drop(s);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0"])
        .env("SNAKECAGE_SANDBOX__REQUIRE", r#"["seccomp"]"#)
        .env("SNAKECAGE_SANDBOX__LAYERS_OFF", r#"["seccomp"]"#)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sandbox layer seccomp is both required and switched off"),
        "{stderr}"
    );
}
