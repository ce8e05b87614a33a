//! An upstream MCP server's answers are read only so far: a result past
//! `tools.max_result_bytes`, however large its message (past rmcp's own 16 MiB too), fails
//! its one call with a `limit` error at once, over stdio and streamable HTTP (SSE events or
//! JSON bodies) alike, while
//! the calls in flight beside it and the calls after it are answered. What a stdio server
//! writes outside the protocol is logged under its name, cut and escaped.

use serde_json::Value;

use crate::harness::{Options, Server, repo_root};
use crate::tools_mcp::{Upstream, fixture_listening_on};

/// A free port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A service with the unruly fixture as `calc` (stdio), `web` (HTTP, answering in SSE
/// events) and `json` (HTTP, answering in JSON bodies), results capped at 100 000 bytes.
async fn service(dir: &std::path::Path) -> (Server, [Upstream; 2]) {
    let (sse, json) = (free_port(), free_port());
    let fixtures = [("http", sse), ("http-json", json)].map(|(mode, port)| {
        fixture_listening_on("mcp_unruly.py", &[mode.into(), port.to_string()], port)
    });
    let python = repo_root().join(".venv-tools/bin/python");
    let script = repo_root().join("tests/clients/mcp_unruly.py");
    let config = format!(
        "[tools]\nmax_result_bytes = 100000\ncall_timeout_ms = 20000\n\n[[tools.mcp]]\nname = \"calc\"\ncommand = [{:?}, {:?}]\n\n[[tools.mcp]]\nname = \"web\"\nurl = \"http://127.0.0.1:{sse}/mcp\"\n\n[[tools.mcp]]\nname = \"json\"\nurl = \"http://127.0.0.1:{json}/mcp\"\n",
        python.display().to_string(),
        script.display().to_string(),
    );
    let path = dir.join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let s = Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;
    (s, fixtures)
}

#[tokio::test]
async fn an_upstream_result_too_large_fails_its_call_alone_over_every_transport() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _http) = service(dir.path()).await;
    // Per server: a call waits in flight; beside it a result just under the cap comes
    // whole, one a little over it and one over 16 MiB fail with `limit`; a call after
    // them is answered, and so is the one in flight.
    let code = r#"
import threading, time
from snakecage import tools
for p in ('calc', 'web', 'json'):
    waited = {}
    def wait():
        try:
            waited['answer'] = tools.call(p + '_wait', seconds=2)['result']
        except tools.ToolError as e:
            waited['answer'] = f'{e.kind} {e.message}'
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    print(p, len(tools.call(p + '_big', n=90000)['result']))
    for n in (150000, 17 << 20):
        try:
            tools.call(p + '_big', n=n)
            print(p, n, 'answered')
        except tools.ToolError as e:
            print(p, n, e.kind, e.message)
    print(p, tools.call(p + '_echo', s='after')['result'])
    t.join()
    print(p, waited['answer'])
"#;
    let body: Value = s
        .run_with(serde_json::json!({"code": code, "timeout_ms": 60000}))
        .await;
    assert_eq!(body["exit_code"], 0, "{body}\n{}", s.log());
    let stdout = body["stdout"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 15, "{stdout}\n{}", s.log());
    for (p, lines) in ["calc", "web", "json"].iter().zip(lines.chunks(5)) {
        assert_eq!(lines[0], format!("{p} 90000"), "{stdout}");
        for (line, n) in lines[1..3].iter().zip([150000, 17 << 20]) {
            let limit = format!(
                "{p} {n} limit the tool's result is larger than the 100000 bytes allowed (tools.max_result_bytes)"
            );
            assert!(line.starts_with(&limit), "{stdout}\n{}", s.log());
        }
        assert_eq!(lines[3], format!("{p} after"), "{stdout}");
        assert_eq!(lines[4], format!("{p} waited 2.0 s"), "{stdout}");
    }
    // The link was never lost, so never remade.
    assert!(
        !s.log().contains("lost the upstream MCP server"),
        "{}",
        s.log()
    );
}

#[tokio::test]
async fn what_a_stdio_server_writes_outside_the_protocol_is_logged_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _http) = service(dir.path()).await;
    let body: Value = s
        .run("from snakecage import tools\nprint(tools.calc_chatter()['result'], tools.calc_echo(s='then')['result'])\n")
        .await;
    assert_eq!(body["stdout"], "said then\n", "{body}\n{}", s.log());
    let log = s.log();
    let output: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["server"] == "calc" && v["fields"]["stream"].is_string())
        .collect();
    let said = |stream: &str, line: &str| {
        output
            .iter()
            .find(|v| v["fields"]["stream"] == stream && v["fields"]["line"] == line)
            .cloned()
    };
    assert!(said("stderr", "\"chatter on stderr\"").is_some(), "{log}");
    // A long line is cut, and what is kept is escaped (no terminal escapes in the log).
    let cut = output
        .iter()
        .find(|v| v["fields"]["cut_bytes"].is_u64())
        .unwrap_or_else(|| panic!("no cut line: {log}"));
    let line = cut["fields"]["line"].as_str().unwrap();
    assert!(line.starts_with("\"\\u{1b}[31meee"), "{line}");
    assert_eq!(cut["fields"]["cut_bytes"], 5005 - 1024, "{cut}");
    // Junk on stdout is logged as such, and the calls after it are answered.
    assert!(
        said("stdout", "\"this is not json-rpc\"").is_some(),
        "{log}"
    );
    assert!(said("stdout", "\"\u{fffd}\u{fffd}\"").is_some(), "{log}");
    // Nothing of it reaches the log raw.
    assert!(
        !log.lines()
            .any(|l| l.starts_with("chatter") || l.starts_with("this is not")),
        "{log}"
    );
}
