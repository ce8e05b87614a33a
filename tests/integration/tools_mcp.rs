//! Code Mode with upstream MCP servers (the official Python SDK's, over stdio and
//! streamable HTTP) and with tools scoped per API key: one key's tools are invisible to
//! another, and one key cannot answer or cancel another key's run.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use crate::harness::{Options, Server, repo_root};

fn keys_add(path: &Path, name: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "add", name, "--keys-file"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn client(key: &str) -> reqwest::Client {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

async fn run(client: &reqwest::Client, base: &str, code: &str) -> Value {
    let resp = client
        .post(format!("{base}/v1/execute"))
        .json(&json!({"code": code}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// The fixture server's process, killed when dropped (a failing test leaves nothing).
pub struct Upstream(std::process::Child);

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the fixture server over streamable HTTP and waits until it listens; with
/// `tls` (a certificate and its key, PEM files), over HTTPS.
pub fn http_upstream(tls: Option<(&Path, &Path)>) -> (Upstream, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    (http_upstream_on(port, tls), port)
}

/// Starts the fixture server over streamable HTTP (with `tls`, HTTPS) on `port` and waits
/// until it listens.
pub fn http_upstream_on(port: u16, tls: Option<(&Path, &Path)>) -> Upstream {
    let args = match tls {
        None => vec!["http".into(), port.to_string()],
        Some((cert, key)) => vec![
            "https".into(),
            port.to_string(),
            cert.display().to_string(),
            key.display().to_string(),
        ],
    };
    fixture_listening_on("mcp_upstream.py", &args, port)
}

/// Starts `script` (a fixture server in `tests/clients`) with `args` and waits until it
/// listens on `port`.
pub fn fixture_listening_on(script: &str, args: &[String], port: u16) -> Upstream {
    let child = Command::new(repo_root().join(".venv-tools/bin/python"))
        .arg(repo_root().join("tests/clients").join(script))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run .venv-tools/bin/python (scripts/test creates .venv-tools)");
    let child = Upstream(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the MCP fixture did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

#[tokio::test]
async fn upstream_mcp_tools_are_python_functions_scoped_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let alice = keys_add(&keys, "alice");
    let bob = keys_add(&keys, "bob");
    let (_upstream, port) = http_upstream(None);
    let python = repo_root().join(".venv-tools/bin/python");
    let script = repo_root().join("tests/clients/mcp_upstream.py");
    let config = format!(
        r#"
[[tools.mcp]]
name = "calc"
command = ["{python}", "{script}"]
tenants = ["alice"]

[[tools.mcp]]
name = "web"
url = "http://127.0.0.1:{port}/mcp"
"#,
        python = python.display(),
        script = script.display(),
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_CONFIG", path.display())
            .env("SNAKECAGE_AUTH__KEYS_FILE", keys.display()),
    )
    .await;
    // `/v1/tools` and `/mcp` describe alice's server to alice alone (`calc` names its tools).
    for (key, hers) in [(&alice, true), (&bob, false)] {
        let (base, owned) = (s.base.clone(), key.clone());
        let listed = tokio::task::spawn_blocking(move || {
            crate::agents::mcp_client_with(&base, "describe", &[&owned])
        })
        .await
        .unwrap();
        let over_mcp = listed["run_python_description"]
            .as_str()
            .unwrap()
            .to_owned();
        let over_rest = client(key)
            .get(format!("{}/v1/tools", s.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for described in [&over_mcp, &over_rest] {
            assert_eq!(described.contains("calc_add ("), hers, "{described}");
            assert!(described.contains("web_add ("), "{described}");
        }
    }
    let (alice, bob) = (client(&alice), client(&bob));

    let code = "from snakecage import tools
print(sorted(t['name'] for t in tools.list()))
print(tools.calc_add(a=2, b=40)['sum'], tools.web_add(a=1, b=1))
try:\n    tools.calc_explode(reason='über')\nexcept tools.ToolError as e:\n    print(e.kind, e.message)
try:\n    tools.calc_add(a='2', b=1)\nexcept tools.ToolArgumentsError as e:\n    print('refused')\n";
    let body = run(&alice, &s.base, code).await;
    assert_eq!(
        body["stdout"],
        "['calc_add', 'calc_explode', 'calc_wait', 'web_add', 'web_explode', 'web_wait']\n42 {'by': 'upstream-fixture', 'sum': 2}\nfailed Error executing tool explode: exploded: über\nrefused\n",
        "{body}"
    );

    // bob does not see alice's server: not in the list, not callable, not in the catalog.
    let code = "from snakecage import tools
print(sorted(t['name'] for t in tools.list()))
try:\n    tools.call('calc_add', a=1, b=2)\nexcept tools.UnknownToolError as e:\n    print('unknown')\n";
    let body = run(&bob, &s.base, code).await;
    assert_eq!(
        body["stdout"], "['web_add', 'web_explode', 'web_wait']\nunknown\n",
        "{body}"
    );
    let catalog: Value = bob
        .get(format!("{}/v1/tools/catalog?query=add", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web_add"], "{catalog}");

    // bob cannot answer or cancel alice's run.
    let resp = alice
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({
            "code": "from snakecage import tools\nprint(tools.ask())",
            "tools": [{"name": "ask", "parameters": {"type": "object"}}],
            "timeout_ms": 20000
        }))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut resp = resp;
    let mut text = String::new();
    let call_id = loop {
        let chunk = resp.chunk().await.unwrap().expect("a tool_call event");
        text.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(at) = text.find("\"call_id\":\"") {
            let rest = &text[at + 11..];
            break rest[..rest.find('"').unwrap()].to_owned();
        }
    };
    let url = format!("{}/v1/runs/{run_id}/tool_calls/{call_id}", s.base);
    let status = bob
        .post(&url)
        .json(&json!({"result": 1}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404);
    let status = bob
        .delete(format!("{}/v1/runs/{run_id}", s.base))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404);
    let status = alice
        .post(&url)
        .json(&json!({"result": "ja"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 204);
    while let Some(chunk) = resp.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains(r#""stdout":"ja\n""#), "{text}");
}
