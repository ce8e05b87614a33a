//! An upstream MCP server that goes away is reconnected in the background: a stdio server
//! killed is started again, an HTTP server that died and came back on its port is
//! connected to again (a new session). Calls made while it is down fail at once with an
//! `unavailable` `ToolError` saying it is unreachable and being reconnected.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Options, Server, descendants_of, repo_root};
use crate::tools_mcp::http_upstream_on;

/// Calls `tools.<tool>(a=20, b=22)` in a run: the sum, or the error's kind and message.
async fn add(s: &Server, tool: &str) -> String {
    let code = format!(
        "from snakecage import tools\ntry:\n    print(tools.{tool}(a=20, b=22)['sum'])\nexcept tools.ToolError as e:\n    print(e.kind, '|', e.message)\n"
    );
    let body: Value = s.run(&code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    body["stdout"].as_str().unwrap().trim_end().to_owned()
}

/// The pids of the stdio fixture servers the service started.
fn stdio_fixtures(s: &Server) -> Vec<u32> {
    descendants_of(s.pid())
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("mcp_upstream.py"))
        })
        .collect()
}

#[tokio::test]
async fn a_dead_upstream_mcp_server_is_reconnected_and_calls_meanwhile_say_it_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = http_upstream_on(port, None);
    let python = repo_root().join(".venv-tools/bin/python");
    let script = repo_root().join("tests/clients/mcp_upstream.py");
    let config = format!(
        "[[tools.mcp]]\nname = \"calc\"\ncommand = [{:?}, {:?}]\n\n[[tools.mcp]]\nname = \"web\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n",
        python.display().to_string(),
        script.display().to_string(),
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let s = Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;
    assert_eq!(add(&s, "calc_add").await, "42");
    assert_eq!(add(&s, "web_add").await, "42");

    // Both die: the stdio server killed, the HTTP one stopped.
    let stdio = stdio_fixtures(&s);
    assert_eq!(stdio.len(), 1, "{stdio:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(stdio[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    drop(http);
    // The HTTP server stays down: each call says so, at once.
    for _ in 0..2 {
        let answer = add(&s, "web_add").await;
        assert!(
            answer.starts_with("unavailable | MCP server 'web' is unreachable"),
            "{answer}"
        );
        assert!(
            answer.contains("reconnecting in the background"),
            "{answer}"
        );
        // Why, in words: no Rust type names (`Transport [rmcp::transport::…<…>] error`).
        assert!(
            !answer.contains("::") && !answer.contains("Transport ["),
            "{answer}"
        );
    }
    // The stdio server: the call that finds it gone fails the same way; it is started
    // again in the background.
    let answer = add(&s, "calc_add").await;
    assert!(
        answer.starts_with("unavailable | MCP server 'calc'"),
        "{answer}"
    );
    assert!(
        !answer.contains("::") && !answer.contains("Transport ["),
        "{answer}"
    );
    // The HTTP server comes back on its port.
    let _http = http_upstream_on(port, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    for tool in ["calc_add", "web_add"] {
        loop {
            let answer = add(&s, tool).await;
            if answer == "42" {
                break;
            }
            assert!(answer.starts_with("unavailable | "), "{tool}: {answer}");
            assert!(
                Instant::now() < deadline,
                "{tool} never came back: {answer}\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let restarted = stdio_fixtures(&s);
    assert!(
        restarted.len() == 1 && restarted != stdio,
        "{stdio:?} → {restarted:?}"
    );
    assert!(
        s.log().contains("upstream MCP server reconnected"),
        "{}",
        s.log()
    );
}
