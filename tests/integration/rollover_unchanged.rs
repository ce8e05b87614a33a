//! A reload that changes nothing starts nothing: the same generation answers at once, no
//! zygote starts, no rollover is counted. A file rewritten in the environment the
//! generation imports from is a change (its new contents serve after the reload), and
//! `?force=true` (or a body `{"force": true}`) rolls over whatever changed.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;

use crate::harness::{Options, Server, site_packages};
use crate::rollover::{
    assert_rollovers, generation, reload, reload_at, start, write_config, zygote_pids,
};

/// Writes the module `snakecage_stamped` (`VALUE = value`) into `dir`, readable by the
/// workers' unprivileged uid.
fn write_module(dir: &Path, value: &str) {
    let file = dir.join("snakecage_stamped.py");
    std::fs::write(&file, format!("VALUE = {value:?}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
}

async fn value(s: &Server) -> Value {
    s.run("import snakecage_stamped\nprint(snakecage_stamped.VALUE)")
        .await["stdout"]
        .clone()
}

#[tokio::test]
async fn a_reload_that_changes_nothing_starts_nothing_and_a_rewritten_module_rolls_over() {
    let dir = tempfile::tempdir().unwrap();
    let packages = site_packages(dir.path(), &[]);
    write_module(&packages, "première");
    let config = dir.path().join("snakecage.toml");
    let extra = format!(
        "\n[python]\nsite_packages = [{:?}]\n",
        packages.display().to_string()
    );
    write_config(&config, &["numpy", "snakecage_stamped"], &extra);
    let s = start(&config, Options::default()).await;
    assert_eq!(value(&s).await, "première\n");
    let zygotes = zygote_pids(&s).await;

    // Nothing edited: the same generation, no zygote started, no rollover counted.
    let (status, info) = reload(&s, None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], false, "{info}");
    assert_eq!(info["id"], 1, "{info}");
    assert_eq!(info["reason"], "start", "{info}");
    let message = info["message"].as_str().unwrap();
    assert!(message.starts_with("nothing changed"), "{message}");
    assert!(message.contains("generation 1"), "{message}");
    assert_eq!(zygote_pids(&s).await, zygotes);
    assert_rollovers(&s.scrape().await, 0, 0, 1);

    // The file rewritten (same configuration): a change, and the new contents serve.
    write_module(&packages, "deuxième");
    let (status, info) = reload(&s, None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], true, "{info}");
    assert_eq!(info["id"], 2, "{info}");
    assert_eq!(value(&s).await, "deuxième\n");
    assert_rollovers(&s.scrape().await, 1, 0, 2);
    let zygotes = zygote_pids(&s).await;
    let (status, info) = reload(&s, None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], false, "{info}");
    assert_eq!(info["id"], 2, "{info}");
    assert_eq!(zygote_pids(&s).await, zygotes);

    // A bad query is told what to write; forced, it rolls over all the same.
    let (status, body) = reload_at(&s, "/v1/admin/reload?force=maybe", None).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("`force`"),
        "{body}"
    );
    let (status, info) = reload_at(&s, "/v1/admin/reload?force=true", None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], true, "{info}");
    assert_eq!(info["id"], 3, "{info}");
    assert_rollovers(&s.scrape().await, 2, 0, 3);
    assert_eq!(generation(&s).await, 3);
    assert_eq!(value(&s).await, "deuxième\n");

    // The same setting as a JSON body: forced too. Bodies it cannot take are refused,
    // naming what to fix, and start nothing.
    let (status, info) = reload_with_body(&s, "/v1/admin/reload", r#"{"force": true}"#).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], true, "{info}");
    assert_eq!(info["id"], 4, "{info}");
    let (status, info) = reload_with_body(&s, "/v1/admin/reload", "{}").await;
    assert_eq!(
        (status, &info["rolled_over"]),
        (200, &Value::Bool(false)),
        "{info}"
    );
    for (path, body, want, says) in [
        (
            "/v1/admin/reload",
            r#"{"forse": true}"#,
            422,
            "unknown field `forse`",
        ),
        (
            "/v1/admin/reload",
            r#"{"force": "yes"}"#,
            422,
            "invalid type",
        ),
        (
            "/v1/admin/reload",
            "[true]",
            422,
            r#"a JSON object ({"force": true})"#,
        ),
        ("/v1/admin/reload", "force=true", 400, "not valid JSON"),
        (
            "/v1/admin/reload?force=true",
            r#"{"force": false}"#,
            400,
            "?force=true in the query, \"force\": false in the body; give it once",
        ),
    ] {
        let (status, error) = reload_with_body(&s, path, body).await;
        assert_eq!(status, want, "{path} {body}: {error}");
        let detail = error["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{path} {body}: {detail}");
    }
    assert_eq!(generation(&s).await, 4);
    assert_rollovers(&s.scrape().await, 3, 0, 4);
}

/// `POST path` with `body` as JSON (`reload_at` sends none).
async fn reload_with_body(s: &Server, path: &str, body: &'static str) -> (u16, Value) {
    let response = s
        .client
        .post(format!("{}{path}", s.base))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}
