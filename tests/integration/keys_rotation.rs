//! Rotating API keys on a running service: a reload re-reads `auth.keys_file` and the
//! inline `[[auth.keys]]` of the configuration file. A key added (with `snakecage keys
//! add`, or inline) works after it, one removed gets 401 at once, a changed one has its new
//! limits, and keys that do not parse or check, a keys file that holds no key, or a
//! configuration left without any key are refused (422) with the keys in force kept. A
//! key's running executions keep counting against its limit whatever a reload changes in
//! its entry, its secret included.

use reqwest::header::AUTHORIZATION;
use serde_json::{Value, json};

use crate::auth::keys_add;
use crate::harness::{Options, Server, check_error_body};
use crate::rollover::{generation, reload, start, write_config};
use crate::streamed::Events;

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

/// A made-up key for `name` (as `snakecage keys add` makes them) and its SHA-256.
fn inline_key(name: &str) -> (String, String) {
    let key = format!(
        "sc_{:0>64}",
        name.bytes().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let hash = snakecage::auth::sha256_hex(&key);
    (key, hash)
}

/// `[[auth.keys]]` tables: (name, sha256, more TOML lines).
fn inline_keys(keys: &[(&str, &str, &str)]) -> String {
    let mut toml = String::new();
    for (name, sha256, more) in keys {
        toml.push_str(&format!(
            "\n[[auth.keys]]\nname = {name:?}\nsha256 = {sha256:?}\n{more}\n"
        ));
    }
    toml
}

/// Keys given inline in the configuration file (`[[auth.keys]]`) are re-read by a reload,
/// as the keys file is: a key added works, a changed one has its new limits, a removed one
/// gets 401, the whole set at once; a configuration whose keys are broken, or that has no
/// key left, is refused (422 naming what to fix) and the keys in force stay. SIGHUP does
/// the same. No new generation is started for a change of keys alone.
#[tokio::test]
async fn a_reload_rereads_inline_keys_and_refuses_broken_ones() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    let (ops_key, ops) = inline_key("ops");
    let (alice_key, alice) = inline_key("alice");
    let (bob_key, bob) = inline_key("bob");
    let (carol_key, carol) = inline_key("carol");
    let admin = ("ops", ops.as_str(), "scopes = [\"admin\"]");
    let write = |keys: &[(&str, &str, &str)]| write_config(&config, &["numpy"], &inline_keys(keys));
    write(&[admin, ("alice", &alice, "max_concurrent = 1")]);
    let s = start(&config, Options::default()).await;
    assert_eq!(run_as(&s, &bob_key).await.0, 401);

    // alice at her max_concurrent of 1.
    let long = {
        let client = s.client.clone();
        let url = format!("{}/v1/execute", s.base);
        let key = alice_key.clone();
        tokio::spawn(async move {
            client
                .post(url)
                .header(AUTHORIZATION, format!("Bearer {key}"))
                .json(&json!({"code": "import time\ntime.sleep(50)", "timeout_ms": 60000}))
                .send()
                .await
        })
    };
    crate::reliability::eventually(20, "alice's long run is running", async || {
        s.health().await["pool"]["busy"] == 1
    })
    .await;
    let (status, body) = run_as(&s, &alice_key).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("already has 1 executions running, its max_concurrent limit"),
        "{body}"
    );

    // bob added, alice's limit raised: both in force from the reload's answer on.
    write(&[
        admin,
        ("alice", &alice, "max_concurrent = 2"),
        ("bob", &bob, ""),
    ]);
    let (status, body) = reload(&s, Some(&ops_key)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], false, "{body}");
    assert_eq!(body["keys"]["added"], json!(["bob"]), "{body}");
    assert_eq!(body["keys"]["changed"], json!(["alice"]), "{body}");
    assert_eq!(body["keys"]["removed"], json!([]), "{body}");
    assert_eq!(
        body["keys"]["config_file"],
        config.display().to_string(),
        "{body}"
    );
    assert_eq!(body["keys"].get("file"), None, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "API keys re-read from the [[auth.keys]] of {}: added bob; changed alice",
            config.display()
        )),
        "{message}"
    );
    let (status, ran) = run_as(&s, &alice_key).await;
    assert_eq!(
        (status, ran["stdout"].as_str()),
        (200, Some("grüß dich\n")),
        "{ran}"
    );
    assert_eq!(run_as(&s, &bob_key).await.0, 200);
    assert!(!long.is_finished(), "alice's long run ended early");

    // alice removed: 401 from the reload on.
    write(&[admin, ("bob", &bob, "")]);
    let (status, body) = reload(&s, Some(&ops_key)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["keys"]["removed"], json!(["alice"]), "{body}");
    assert_eq!(run_as(&s, &alice_key).await.0, 401);
    assert_eq!(run_as(&s, &bob_key).await.0, 200);

    // Broken: a hash that is no hash, a table without one, no key at all. Each is refused
    // naming what to fix, and the keys in force stay.
    let refused = async |keys: &[(&str, &str, &str)], says: &[&str]| {
        write(keys);
        let (status, body) = reload(&s, Some(&ops_key)).await;
        assert_eq!(status, 422, "{body}");
        let detail = body["detail"].as_str().unwrap();
        for said in says {
            assert!(detail.contains(said), "{said:?} not in {detail}");
        }
        assert!(detail.contains("nothing changed"), "{detail}");
        assert_eq!(run_as(&s, &bob_key).await.0, 200);
        assert_eq!(run_as(&s, &carol_key).await.0, 401);
    };
    refused(
        &[admin, ("bob", &bob, ""), ("carol", "pas-un-hash", "")],
        &["API key \"carol\"", "sha256 must be 64 hex digits"],
    )
    .await;
    write_config(
        &config,
        &["numpy"],
        &format!(
            "{}\n[[auth.keys]]\nname = \"carol\"\n",
            inline_keys(&[admin, ("bob", &bob, "")])
        ),
    );
    let (status, body) = reload(&s, Some(&ops_key)).await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    // The file is named as figment shows it: relative to the working directory when that
    // is shorter (`../.tmpXXXX/snakecage.toml` from a checkout in /tmp), else absolute.
    let in_dir = config
        .parent()
        .and_then(|d| d.file_name())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        detail.contains("missing field `sha256`")
            && detail.contains("auth.keys")
            && detail.contains(&format!("{in_dir}/snakecage.toml"))
            && detail.contains("nothing changed"),
        "{detail}"
    );
    assert_eq!(run_as(&s, &carol_key).await.0, 401);
    refused(&[], &["never turns authentication off"]).await;
    let (status, body) = s.post("/v1/execute", &json!({"code": "print(1)"})).await;
    assert_eq!(status, 401, "{body}");

    // SIGHUP re-reads them too.
    write(&[admin, ("bob", &bob, ""), ("carol", &carol, "")]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    crate::reliability::eventually(30, "carol's key works after SIGHUP", async || {
        run_as(&s, &carol_key).await.0 == 200
    })
    .await;
    assert_eq!(run_as(&s, &bob_key).await.0, 200);
    assert_eq!(generation(&s).await, 1);
}

/// The stranger's sequence: erin (`max_concurrent = 1`) has a run going and a second one
/// gets 429; her `max_sessions` is edited and the keys reloaded (`changed: ["erin"]`): a
/// new run still gets 429, since the first still runs. Her secret replaced and reloaded:
/// the old key gets 401, the new one 429 (the run the old key started still counts, the
/// tenant is the name). Once that run is cancelled, the new key runs.
#[tokio::test]
async fn editing_a_keys_entry_and_reloading_keeps_its_running_executions_counted() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("schlüssel.toml");
    let admin = keys_add(&keys, "ops", &["--admin"]);
    let erin = keys_add(
        &keys,
        "erin",
        &["--max-concurrent", "1", "--max-sessions", "1"],
    );
    let config = dir.path().join("snakecage.toml");
    write_config(
        &config,
        &["numpy"],
        &format!("\n[auth]\nkeys_file = {:?}\n", keys.display().to_string()),
    );
    let s = start(&config, Options::default()).await;

    // Run `a`: streamed, so it can be seen running and then cancelled.
    let response = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .header(AUTHORIZATION, format!("Bearer {erin}"))
        .json(&json!({
            "code": "import time\nprint('läuft', flush=True)\ntime.sleep(60)",
            "timeout_ms": 60000
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let run_id = response.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut events = Events::new(response);
    let (event, data) = events.next().await.unwrap();
    assert_eq!(
        (event.as_str(), &data["data"]),
        ("output", &json!("läuft\n"))
    );

    let refused = async |key: &str| {
        let (status, body) = run_as(&s, key).await;
        assert_eq!(status, 429, "{body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains(
                "API key 'erin' already has 1 executions running, its max_concurrent limit"
            ),
            "{detail}"
        );
    };
    refused(&erin).await;

    // Only max_sessions changes, to more than the service's sessions.max_sessions (64):
    // taken, and the log says the global limit wins.
    let text = std::fs::read_to_string(&keys).unwrap();
    assert_eq!(text.matches("max_sessions = 1").count(), 1, "{text}");
    std::fs::write(
        &keys,
        text.replace("max_sessions = 1", "max_sessions = 100"),
    )
    .unwrap();
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["keys"]["changed"], json!(["erin"]), "{body}");
    let log = s.log();
    assert!(
        log.contains(
            "API key 'erin' has max_sessions = 100, above the service's sessions.max_sessions \
             = 64: it can hold at most 64 sessions"
        ),
        "{log}"
    );
    refused(&erin).await;

    // A new secret for erin: the same tenant, whose run `a` still counts.
    let (rotated, rotated_hash) = inline_key("erin-neu");
    let text = std::fs::read_to_string(&keys).unwrap();
    let old_hash = snakecage::auth::sha256_hex(&erin);
    assert!(text.contains(&old_hash), "{text}");
    std::fs::write(&keys, text.replace(&old_hash, &rotated_hash)).unwrap();
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["keys"]["changed"], json!(["erin"]), "{body}");
    assert_eq!(run_as(&s, &erin).await.0, 401);
    refused(&rotated).await;

    // Run `a` ends: erin is under her limit again.
    let cancelled = s
        .client
        .delete(format!("{}/v1/runs/{run_id}", s.base))
        .header(AUTHORIZATION, format!("Bearer {rotated}"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 204);
    let result = loop {
        match events.next().await {
            Some((event, data)) if event == "result" => break data,
            Some(_) => {}
            None => panic!("the stream of run a ended without a result"),
        }
    };
    assert_eq!(result["verdict"], "killed", "{result}");
    let (status, ran) = run_as(&s, &rotated).await;
    assert_eq!(
        (status, ran["stdout"].as_str()),
        (200, Some("grüß dich\n")),
        "{ran}"
    );
}
