//! API keys and tenant isolation: missing and bad keys, one tenant's files and sessions
//! invisible to another (even by id), per-key limits, MCP as the caller, the refusal to
//! serve beyond loopback without keys, and a keys file without keys refused at start. The
//! keys CLI is in `keys_cli`; rotating keys on a running service in `keys_rotation`.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use crate::agents::{mcp_client_output, mcp_client_with, texts};
use crate::harness::{Options, Server, repo_root};

/// `snakecage keys add NAME --keys-file PATH [limits…]`: the key it prints.
pub fn keys_add(path: &Path, name: &str, limits: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "add", name, "--keys-file"])
        .arg(path)
        .args(limits)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keys add failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A server with a keys file holding `alice` (with `alice_limits`) and `bob`.
async fn two_tenants(alice_limits: &[&str]) -> (Server, Tenant, Tenant, tempfile::TempDir) {
    two_tenants_with(alice_limits, Options::default()).await
}

/// [`two_tenants`], the server started with `options`.
async fn two_tenants_with(
    alice_limits: &[&str],
    options: Options,
) -> (Server, Tenant, Tenant, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let alice = keys_add(&keys, "alice", alice_limits);
    let bob = keys_add(&keys, "bob", &[]);
    let server = Server::start_with(options.env("SNAKECAGE_AUTH__KEYS_FILE", keys.display())).await;
    let base = server.base.clone();
    (
        server,
        Tenant::new(&base, &alice),
        Tenant::new(&base, &bob),
        dir,
    )
}

/// A client that sends one tenant's key.
pub struct Tenant {
    base: String,
    key: String,
    client: reqwest::Client,
}

impl Tenant {
    pub fn new(base: &str, key: &str) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
        );
        Self {
            base: base.to_owned(),
            key: key.to_owned(),
            client: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap(),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, HeaderMap, Value) {
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status >= 400 {
            crate::harness::check_error_body(status, &body);
        }
        (status, headers, body)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let (s, _, b) = self
            .send(self.client.get(format!("{}{path}", self.base)))
            .await;
        (s, b)
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (s, _, b) = self
            .send(self.client.post(format!("{}{path}", self.base)).json(&body))
            .await;
        (s, b)
    }

    async fn delete(&self, path: &str) -> u16 {
        self.send(self.client.delete(format!("{}{path}", self.base)))
            .await
            .0
    }

    pub async fn upload(&self, name: &str, bytes: Vec<u8>) -> (u16, Value) {
        let (s, _, b) = self.upload_with_headers(name, bytes).await;
        (s, b)
    }

    async fn upload_with_headers(&self, name: &str, bytes: Vec<u8>) -> (u16, HeaderMap, Value) {
        let part = reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned());
        let form = reqwest::multipart::Form::new().part("file", part);
        self.send(
            self.client
                .post(format!("{}/v1/files", self.base))
                .multipart(form),
        )
        .await
    }

    async fn file_ids(&self) -> Vec<String> {
        let (status, body) = self.get("/v1/files").await;
        assert_eq!(status, 200, "{body}");
        body["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["file_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

#[tokio::test]
async fn two_tenants_cannot_see_fetch_delete_or_use_each_others_files_and_sessions() {
    let (server, alice, bob, _dir) = two_tenants(&[]).await;

    // An uploaded file, and one a run wrote.
    let (status, up) = alice.upload("secret.txt", b"alice's secret".to_vec()).await;
    assert_eq!(status, 201, "{up}");
    let uploaded = up["file_id"].as_str().unwrap().to_owned();
    let (status, ran) = alice
        .post(
            "/v1/execute",
            json!({"code": "open('out.txt', 'w').write('written by alice')"}),
        )
        .await;
    assert_eq!(status, 200, "{ran}");
    let written = ran["files"][0]["file_id"].as_str().unwrap().to_owned();
    let mut mine = alice.file_ids().await;
    mine.sort();
    let mut expected = vec![uploaded.clone(), written.clone()];
    expected.sort();
    assert_eq!(mine, expected);
    assert!(bob.file_ids().await.is_empty());

    let unknown = uuid_like();
    let (_, not_found) = bob.get(&format!("/v1/files/{unknown}")).await;
    for id in [&uploaded, &written] {
        let (status, body) = bob.get(&format!("/v1/files/{id}")).await;
        assert_eq!(status, 404, "{body}");
        // The same answer as for an id that never existed, apart from the id itself.
        assert_eq!(
            body["detail"].as_str().unwrap().replace(id.as_str(), "ID"),
            not_found["detail"]
                .as_str()
                .unwrap()
                .replace(&unknown, "ID")
        );
        assert_eq!(bob.delete(&format!("/v1/files/{id}")).await, 404);
        let (status, body) = bob
            .post(
                "/v1/execute",
                json!({"code": "print(open('f').read())", "files": [{"path": "f", "file_id": id}]}),
            )
            .await;
        assert_eq!(status, 404, "{body}");
        let (status, body) = bob
            .post(
                "/v1/sessions",
                json!({"files": [{"path": "f", "file_id": id}]}),
            )
            .await;
        assert_eq!(status, 404, "{body}");
    }
    // Still there for alice, and usable.
    let (status, body) = alice.get(&format!("/v1/files/{uploaded}")).await;
    assert_eq!(
        (status, body),
        (200, Value::String("alice's secret".into()))
    );
    let (status, body) = alice
        .post(
            "/v1/execute",
            json!({"code": "print(open('f').read())", "files": [{"path": "f", "file_id": written}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "written by alice\n");

    // Sessions.
    let (status, created) = alice.post("/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["session_id"].as_str().unwrap().to_owned();
    let (status, _) = alice
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            json!({"code": "x = 41"}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, listed) = bob.get("/v1/sessions").await;
    assert_eq!(listed["sessions"], json!([]));
    let (_, listed) = alice.get("/v1/sessions").await;
    assert_eq!(listed["sessions"][0]["session_id"], sid.as_str());
    let run = json!({"code": "print(x)"});
    for (path, body) in [
        (format!("/v1/sessions/{sid}/execute"), Some(&run)),
        (format!("/v1/sessions/{sid}/execute/stream"), Some(&run)),
        (format!("/v1/sessions/{sid}/reset"), None),
        (
            format!("/v1/sessions/{sid}/bash"),
            Some(&json!({"command": "ls"})),
        ),
    ] {
        let (status, answer) = bob.post(&path, body.cloned().unwrap_or(json!({}))).await;
        assert_eq!(status, 404, "{path}: {answer}");
    }
    let (status, body) = bob.get(&format!("/v1/sessions/{sid}")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(bob.delete(&format!("/v1/sessions/{sid}")).await, 404);
    // Alice's session is untouched by all that.
    let (status, body) = alice
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            json!({"code": "print(x + 1)"}),
        )
        .await;
    assert_eq!((status, body["stdout"].clone()), (200, json!("42\n")));
    assert_eq!(alice.delete(&format!("/v1/sessions/{sid}")).await, 204);

    // The metrics count executions per configured key, and only what ran.
    let (status, _, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    let series = |tenant: &str, kind: &str| {
        format!("snakecage_tenant_executions_total{{kind=\"{kind}\",tenant=\"{tenant}\"}}")
    };
    for (tenant, kind, n) in [
        ("alice", "stateless", 2),
        ("alice", "session", 2),
        ("bob", "stateless", 0),
        ("bob", "session", 0),
    ] {
        let line = format!("{} {n}", series(tenant, kind));
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
}

fn uuid_like() -> String {
    "00000000-0000-4000-8000-000000000000".into()
}

#[tokio::test]
async fn missing_and_bad_keys_get_401_with_a_bearer_challenge_and_probes_stay_open() {
    let (server, alice, _bob, _dir) = two_tenants(&[]).await;
    let anonymous = reqwest::Client::new();
    let header = |v: &[u8]| Some(reqwest::header::HeaderValue::from_bytes(v).unwrap());
    let invalid = "Bearer error=\"invalid_token\"";
    let malformed = "Bearer error=\"invalid_request\"";
    let cases = [
        (None, "Bearer", "an API key is required"),
        (
            header(b"Bearer sc_not_a_key"),
            invalid,
            "the API key is not valid",
        ),
        (
            header(format!("Bearer {}x", alice.key).as_bytes()),
            invalid,
            "the API key is not valid",
        ),
        // Not a key at all: the detail says what is wrong with the header.
        (
            header(format!("Basic {}", alice.key).as_bytes()),
            malformed,
            "is not `Bearer <key>`",
        ),
        (header(b"Bearer "), malformed, "is not `Bearer <key>`"),
        (
            header("Bearer clé-à-moi".as_bytes()),
            malformed,
            "not visible ASCII, which no API key has (`snakecage keys add` makes keys of `sc_`",
        ),
        (header(b"Bearer sc_ab\tcd"), malformed, "not visible ASCII"),
    ];
    for path in [
        "/v1/files",
        "/v1/sessions",
        "/v1/packages",
        "/",
        "/v1/status",
        "/nope",
    ] {
        for (auth, challenge, detail) in &cases {
            let mut req = anonymous.get(format!("{}{path}", server.base));
            if let Some(auth) = auth {
                req = req.header(AUTHORIZATION, auth.clone());
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{path} with {auth:?}");
            assert_eq!(resp.headers()["www-authenticate"], *challenge);
            let body: Value = resp.json().await.unwrap();
            let text = body["detail"].as_str().unwrap();
            assert!(text.contains(detail), "{auth:?}: {body}");
        }
    }
    let resp = anonymous
        .post(format!("{}/v1/execute", server.base))
        .json(&json!({"code": "print('pwned')"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // Two Authorization headers, a valid key in either place: which one counts is not
    // left to the reader (a proxy in front may read the other), so neither does.
    for pair in [
        [
            format!("Bearer {}", alice.key),
            "Bearer sc_not_a_key".to_owned(),
        ],
        [
            "Bearer sc_not_a_key".to_owned(),
            format!("Bearer {}", alice.key),
        ],
        [
            format!("Bearer {}", alice.key),
            format!("Bearer {}", alice.key),
        ],
    ] {
        let resp = anonymous
            .post(format!("{}/v1/execute", server.base))
            .header(AUTHORIZATION, &pair[0])
            .header(AUTHORIZATION, &pair[1])
            .json(&json!({"code": "print('ünï')"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["code"], "bad_request", "{body}");
        assert_eq!(
            body["detail"],
            "the request has 2 Authorization headers; send one, `Authorization: Bearer <key>`",
            "{body}"
        );
    }
    for path in ["/health", "/ready", "/metrics"] {
        let (status, _, _) = server.get(path).await;
        assert_eq!(status, 200, "{path}");
    }
    let (status, _) = alice.get("/v1/packages").await;
    assert_eq!(status, 200);

    // MCP: no key, no session (the SDK client gives up); the endpoint says 401 like the rest.
    let resp = anonymous
        .post(format!("{}/mcp", server.base))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    // The service's error, and a JSON-RPC error in the same object (what MCP clients show).
    let body: serde_json::Value = resp.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap().to_owned();
    assert_eq!(body["code"], "unauthorized", "{body}");
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert_eq!(body["id"], serde_json::Value::Null, "{body}");
    assert_eq!(
        body["error"],
        json!({"code": -32600, "message": detail}),
        "{body}"
    );
    // The official SDK's client fails, and says why in the service's words.
    let base = server.base.clone();
    let out = tokio::task::spawn_blocking(move || mcp_client_output(&base, "stateless", &[]))
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&detail), "{detail:?} not in:\n{stderr}");
}

#[tokio::test]
async fn mcp_tool_calls_are_made_as_the_caller_and_scoped_like_the_api() {
    let (server, alice, bob, _dir) = two_tenants(&[]).await;
    let (status, created) = alice.post("/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["session_id"].as_str().unwrap().to_owned();
    let base = server.base.clone();
    let key = bob.key.clone();
    let r = tokio::task::spawn_blocking(move || mcp_client_with(&base, "foreign", &[&key, &sid]))
        .await
        .unwrap();
    assert_eq!(r["foreign"]["is_error"], true, "{r}");
    assert!(texts(&r["foreign"]).contains("404"), "{r}");
    assert_eq!(r["mine"]["is_error"], false, "{r}");
    assert!(texts(&r["mine"]).contains("42"), "{r}");
}

#[tokio::test]
async fn per_key_limits_answer_429_and_leave_other_keys_alone() {
    let (server, alice, bob, _dir) = two_tenants(&[
        "--max-concurrent",
        "1",
        "--max-sessions",
        "1",
        "--max-stored-mb",
        "1",
    ])
    .await;

    // Concurrency: one run at a time for alice.
    let slow = alice.post(
        "/v1/execute",
        json!({"code": "import time; time.sleep(1.5); print('done')", "timeout_ms": 10000}),
    );
    let second = async {
        server
            .wait_for_pool("alice's slow run", |p| p["busy"] == 1)
            .await;
        let resp = alice
            .client
            .post(format!("{}/v1/execute", alice.base))
            .json(&json!({"code": "print(1)"}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let retry = resp.headers().get("retry-after").cloned();
        let body: Value = resp.json().await.unwrap();
        let (bob_status, bob_body) = bob.post("/v1/execute", json!({"code": "print(2)"})).await;
        (status, retry, body, bob_status, bob_body)
    };
    let ((slow_status, slow_body), (status, retry, body, bob_status, bob_body)) =
        tokio::join!(slow, second);
    assert_eq!(slow_status, 200, "{slow_body}");
    assert_eq!(slow_body["stdout"], "done\n");
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry.unwrap(), "1");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("alice") && detail.contains("max_concurrent"),
        "{detail}"
    );
    assert_eq!(
        (bob_status, bob_body["stdout"].clone()),
        (200, json!("2\n"))
    );
    // The slot is given back when the run ends.
    let (status, body) = alice.post("/v1/execute", json!({"code": "print(3)"})).await;
    assert_eq!(status, 200, "{body}");

    // Sessions: one for alice.
    let (status, _) = alice.post("/v1/sessions", json!({})).await;
    assert_eq!(status, 201);
    let (status, body) = alice.post("/v1/sessions", json!({})).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("max_sessions"),
        "{body}"
    );
    let (status, _) = bob.post("/v1/sessions", json!({})).await;
    assert_eq!(status, 201);

    // Storage: 1 MB for alice. A file larger than the whole quota says so, not that the
    // quota is used up (nothing is stored yet), and is too large (413): no wait makes room
    // for it, so there is no Retry-After. One that does not fit beside what is stored says
    // both numbers, and is a limit to retry after deleting (429). The store reads the
    // upload as it streams, refuses it once what it read passes the quota, and reads the
    // rest of the body before it answers: it knows the whole size.
    crate::files::assert_larger_than_the_whole_quota(
        alice
            .upload_with_headers("huge.bin", vec![1u8; 2 << 20])
            .await,
        "2 MB",
        "API key 'alice'",
        "its own quota of 1 MB (max_stored_mb)",
    );
    let (status, body) = alice.upload("a.bin", vec![1u8; 700 << 10]).await;
    assert_eq!(status, 201, "{body}");
    let (status, headers, body) = alice
        .upload_with_headers("b.bin", vec![1u8; 700 << 10])
        .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "tenant_limit", "{body}");
    assert_eq!(headers["retry-after"], "60", "{headers:?}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "This file would take API key 'alice' past its own quota of 1 MB \
             (max_stored_mb): 704 KB is used and the file is 700 KB, counted as 704 KB; \
             delete files you no longer need and retry"
        ),
        "{detail}"
    );
    // Larger than the whole quota with 700 KB stored: refused part-way, still 413.
    crate::files::assert_larger_than_the_whole_quota(
        alice
            .upload_with_headers("énorme.bin", vec![1u8; 2 << 20])
            .await,
        "2 MB",
        "API key 'alice'",
        "its own quota of 1 MB (max_stored_mb)",
    );
    let (status, body) = bob.upload("b.bin", vec![1u8; 700 << 10]).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn without_keys_a_non_loopback_listen_is_refused_unless_explicitly_allowed() {
    let state: PathBuf = tempfile::tempdir().unwrap().keep();
    let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "0.0.0.0:0", "--venv"])
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", &state)
        .env_remove("SNAKECAGE_ALLOW_UNAUTHENTICATED")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&state);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0")
            && stderr.contains("--allow-unauthenticated"),
        "{stderr}"
    );

    let server = Server::start_with(
        Options::default()
            .listen("0.0.0.0:0")
            .arg("--allow-unauthenticated"),
    )
    .await;
    assert!(
        server.log().contains("NO AUTHENTICATION"),
        "{}",
        server.log()
    );
    assert_eq!(server.run("print(1)").await["stdout"], "1\n");
}

#[tokio::test]
async fn a_keys_file_with_no_keys_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("clés.toml");
    std::fs::write(&keys, "# toutes les clés ont été retirées\n").unwrap();
    let state = dir.path().join("state");
    // Under `timeout`: a service that started anyway is stopped (and the test fails).
    let out = Command::new("timeout")
        .args(["60", env!("CARGO_BIN_EXE_snakecage")])
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", &state)
        .env("SNAKECAGE_AUTH__KEYS_FILE", &keys)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "auth.keys_file {} holds no keys; add one with `snakecage keys add` or unset auth.keys_file to run without keys",
            keys.display()
        )),
        "{stderr}"
    );
}

/// `tenant` creates a session, which must be made: its id.
async fn create_session(tenant: &Tenant) -> String {
    let (status, body) = tenant.post("/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{body}");
    body["session_id"].as_str().unwrap().to_owned()
}

/// `tenant` runs `code` in its session `id`: the status and the body.
async fn run_in_session(tenant: &Tenant, id: &str, code: &str) -> (u16, Value) {
    tenant
        .post(
            &format!("/v1/sessions/{id}/execute"),
            json!({ "code": code }),
        )
        .await
}

/// A call on a session evicted from the full table: 410 saying why.
fn assert_evicted(status: u16, r: &Value) {
    assert_eq!(status, 410, "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(detail.contains("least recently used"), "{r}");
}

/// A table full with one session of each of two tenants: the one creating a session gives
/// up its own, though the other's is the least recently used.
#[tokio::test]
async fn a_tenant_holding_as_many_sessions_as_another_evicts_its_own_for_a_new_one() {
    let (s, alice, bob, _dir) = two_tenants_with(
        &[],
        Options::default().env("SNAKECAGE_SESSIONS__MAX_SESSIONS", 2),
    )
    .await;
    let hers = create_session(&alice).await;
    let (status, r) = run_in_session(&alice, &hers, "état = 'gardé'").await;
    assert_eq!(status, 200, "{r}");
    let his_first = create_session(&bob).await;
    let (status, r) = run_in_session(&bob, &his_first, "1").await;
    assert_eq!(status, 200, "{r}");
    let his_second = create_session(&bob).await;
    let (status, r) = run_in_session(&bob, &his_first, "1").await;
    assert_evicted(status, &r);
    let (status, r) = run_in_session(&bob, &his_second, "print('ok')").await;
    assert_eq!((status, r["stdout"].clone()), (200, json!("ok\n")), "{r}");
    let (status, r) = run_in_session(&alice, &hers, "print(état)").await;
    assert_eq!(
        (status, r["stdout"].clone()),
        (200, json!("gardé\n")),
        "{r}\n{}",
        s.log()
    );
}

/// At `sessions.max_sessions`, a tenant that keeps creating sessions evicts its own, least
/// recently used first, never the one session another tenant holds. A key's own
/// `max_sessions` above the global one is taken, with a warning at start: the global wins.
#[tokio::test]
async fn a_full_session_table_evicts_from_the_tenant_that_holds_the_most() {
    let (s, alice, bob, _dir) = two_tenants_with(
        &["--max-sessions", "5"],
        Options::default().env("SNAKECAGE_SESSIONS__MAX_SESSIONS", 3),
    )
    .await;
    let log = s.log();
    assert!(
        log.contains(
            "API key 'alice' has max_sessions = 5, above the service's sessions.max_sessions = \
             3: it can hold at most 3 sessions"
        ),
        "{log}"
    );
    assert!(!log.contains("API key 'bob' has max_sessions"), "{log}");
    // Alice's one session is the least recently used of all when the table fills up.
    let hers = create_session(&alice).await;
    let (status, r) = run_in_session(&alice, &hers, "donnée = 'à garder'").await;
    assert_eq!(status, 200, "{r}");
    let mut his = Vec::new();
    for _ in 0..4 {
        his.push(create_session(&bob).await);
    }
    // Bob's third and fourth sessions evicted his first two: his own, oldest first.
    for id in &his[..2] {
        let (status, r) = run_in_session(&bob, id, "1").await;
        assert_evicted(status, &r);
    }
    for id in &his[2..] {
        let (status, r) = run_in_session(&bob, id, "1").await;
        assert_eq!(status, 200, "{r}");
    }
    let (status, r) = run_in_session(&alice, &hers, "print(donnée)").await;
    assert_eq!(
        (status, r["stdout"].clone()),
        (200, json!("à garder\n")),
        "{r}"
    );
}
