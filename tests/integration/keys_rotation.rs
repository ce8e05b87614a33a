//! Rotating API keys on a running service: a reload re-reads `auth.keys_file`. A key added
//! with `snakecage keys add` works after it, one removed from the file gets 401 at once,
//! and a keys file that does not parse or holds no key is refused (422) with the keys in
//! force kept.

use reqwest::header::AUTHORIZATION;
use serde_json::{Value, json};

use crate::auth::keys_add;
use crate::harness::{Options, Server, check_error_body};
use crate::rollover::{generation, reload, start, write_config};

/// `POST /v1/execute` of `print(...)` with `key`: the status, and stdout when 200.
async fn run_as(s: &Server, key: &str) -> (u16, Value) {
    let response = s
        .client
        .post(format!("{}/v1/execute", s.base))
        .header(AUTHORIZATION, format!("Bearer {key}"))
        .json(&json!({"code": "print('grüß dich')"}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    if status >= 400 {
        check_error_body(status, &body);
    }
    (status, body)
}

#[tokio::test]
async fn a_reload_rotates_the_keys_file_and_a_broken_or_empty_one_keeps_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("clés.toml");
    let admin = keys_add(&keys, "ops", &["--admin"]);
    let alice = keys_add(&keys, "alice", &[]);
    let config = dir.path().join("snakecage.toml");
    write_config(
        &config,
        &["numpy"],
        &format!("\n[auth]\nkeys_file = {:?}\n", keys.display().to_string()),
    );
    let s = start(&config, Options::default()).await;
    assert_eq!(run_as(&s, &alice).await.0, 200);

    // A key added while the service runs works once the service reloads.
    let bob = keys_add(&keys, "bob", &[]);
    assert_eq!(run_as(&s, &bob).await.0, 401);
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], false, "{body}");
    assert_eq!(body["keys"]["added"], json!(["bob"]), "{body}");
    assert_eq!(body["keys"]["removed"], json!([]), "{body}");
    assert_eq!(body["keys"]["file"], keys.display().to_string(), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "API keys re-read from {}: added bob",
            keys.display()
        )),
        "{message}"
    );
    let (status, ran) = run_as(&s, &bob).await;
    assert_eq!((status, ran["stdout"].as_str()), (200, Some("grüß dich\n")));

    // A key removed from the file gets 401 from the reload on.
    let text = std::fs::read_to_string(&keys).unwrap();
    let without_alice: Vec<&str> = text
        .split("[[keys]]")
        .filter(|block| !block.contains("name = \"alice\""))
        .collect();
    std::fs::write(&keys, without_alice.join("[[keys]]")).unwrap();
    assert_eq!(run_as(&s, &alice).await.0, 200, "not before the reload");
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["keys"]["removed"], json!(["alice"]), "{body}");
    assert_eq!(body["keys"]["added"], json!([]), "{body}");
    let (status, body) = run_as(&s, &alice).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(run_as(&s, &bob).await.0, 200);

    // A keys file that does not parse: 422 naming the file and the problem; keys kept.
    let good = std::fs::read_to_string(&keys).unwrap();
    std::fs::write(&keys, format!("{good}\n[[keys]]\nname = \"eve\"\n")).unwrap();
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("keys file {}", keys.display()))
            && detail.contains("missing field `sha256`")
            && detail.contains("the API keys in force stay"),
        "{detail}"
    );
    assert_eq!(run_as(&s, &bob).await.0, 200);

    // An emptied keys file never turns authentication off.
    std::fs::write(&keys, "# plus aucune clé\n").unwrap();
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("auth.keys_file {} holds no keys", keys.display())),
        "{detail}"
    );
    assert_eq!(run_as(&s, &bob).await.0, 200);
    let (status, body) = s.post("/v1/execute", &json!({"code": "print(1)"})).await;
    assert_eq!(status, 401, "{body}");

    // Put back, the same keys are in force and the reload says nothing changed.
    std::fs::write(&keys, &good).unwrap();
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("nothing changed:"),
        "{body}"
    );
    assert_eq!(generation(&s).await, 1);
}
