//! Timeouts sized for scripts: `limits.max_timeout_ms` up to 10 minutes, stated in the tool
//! definitions, and a long streamed run whose client leaves has its worker killed at once.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Options, Server, process_exists, repo_root};
use crate::stream::read_events;

const TEN_MINUTES_MS: u64 = 600_000;

#[tokio::test]
async fn a_max_timeout_beyond_ten_minutes_is_a_clear_startup_error() {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", state.path())
        .env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", "600001")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("limits.max_timeout_ms") && stderr.contains("at most 600000"),
        "{stderr}"
    );
}

#[tokio::test]
async fn ten_minute_runs_are_allowed_stated_to_agents_and_killed_when_the_client_leaves() {
    let s = Server::start_with(
        Options::default().env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", TEN_MINUTES_MS),
    )
    .await;

    // The tool definitions state the live limit, in the text and in the schema.
    let (_, tools) = s.get_json("/v1/tools").await;
    let run = &tools[0]["function"];
    assert_eq!(run["name"], "run_python");
    assert!(
        run["description"]
            .as_str()
            .unwrap()
            .contains("up to 600000 ms"),
        "{run}"
    );
    assert_eq!(
        run["parameters"]["properties"]["timeout_ms"]["maximum"],
        TEN_MINUTES_MS
    );
    // And so do the MCP tools.
    let base = s.base.clone();
    let mcp = tokio::task::spawn_blocking(move || {
        crate::agents::mcp_client_with(&base, "stateless", &[])
    })
    .await
    .unwrap();
    assert!(
        mcp["run_python_description"]
            .as_str()
            .unwrap()
            .contains("up to 600000 ms"),
        "{mcp}"
    );

    let (status, body) = s
        .post(
            "/v1/execute",
            &json!({"code": "1", "timeout_ms": TEN_MINUTES_MS + 1}),
        )
        .await;
    assert_eq!(status, 422);
    assert_eq!(body["code"], "timeout_too_large");
    assert!(
        body["detail"].as_str().unwrap().contains("600000"),
        "{body}"
    );

    // A ten-minute streamed run: the client reads its first line and leaves.
    let started = Instant::now();
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({
            "code": "import os, time\nprint(os.getpid(), flush=True)\nwhile True:\n    time.sleep(1)",
            "timeout_ms": TEN_MINUTES_MS
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = read_events(resp, started, |e| e.event == "output").await;
    let pid: u32 = events[0].data["data"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(process_exists(pid));
    // Gone long before its ten minutes (the bound only keeps a broken build from hanging).
    let deadline = Instant::now() + Duration::from_secs(20);
    while process_exists(pid) {
        assert!(
            Instant::now() < deadline,
            "worker {pid} still runs after its client left"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(s.run("print('next')").await["stdout"], "next\n");
}

#[tokio::test]
async fn a_timed_out_run_says_the_limit_it_hit_and_the_most_allowed_wherever_it_ran() {
    let s = Server::start().await;
    let said = "the run exceeded its timeout of 300 ms (timeout_ms; the most allowed is 60000 \
                ms, limits.max_timeout_ms)";
    let expected = json!({"type": "TimeoutError", "message": said});
    // Stateless: its worker is killed at the deadline and reports nothing itself.
    let body = json!({"code": "import time\ntime.sleep(30)", "timeout_ms": 300});
    let r = s.run_with(body.clone()).await;
    assert_eq!(r["verdict"], "timeout", "{r}");
    assert_eq!(r["error"], expected, "{r}");
    // Streamed: the same result event.
    let response = s.post_response("/v1/execute/stream", &body).await;
    let events = read_events(response, Instant::now(), |_| false).await;
    let result = &events.iter().find(|e| e.event == "result").unwrap().data;
    assert_eq!(result["error"], expected, "{result}");
    // A session's run is interrupted (a KeyboardInterrupt on stderr): the same error.
    let sid = s.new_session().await;
    let (status, r) = s.post(&format!("/v1/sessions/{sid}/execute"), &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["verdict"], "timeout", "{r}");
    assert_eq!(r["error"], expected, "{r}");
    // A run that ends in time keeps its own error, or none.
    assert_eq!(s.run("print(1)").await["error"], Value::Null);
    assert_eq!(s.run("1 / 0").await["error"]["type"], "ZeroDivisionError");
}

/// A stateless worker's kernel CPU-time limit (`limits.max_timeout_ms` and a second) is a
/// backstop behind the clock, but a run whose threads together use CPU faster than time
/// passes reaches it first: its error says that, not that its timeout came. Two cores
/// cannot outrun the clock by a second within a test's patience, so the program brings
/// its own limit forward (past the Python layer, switched off here) and spins.
#[tokio::test]
async fn a_run_ended_by_its_cpu_time_limit_says_so_not_that_its_timeout_came() {
    let s = Server::start_with(Options::default().env(
        "SNAKECAGE_SANDBOX__LAYERS_OFF",
        r#"["audit_hook", "import_guard"]"#,
    ))
    .await;
    let code = "import resource, time
hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
print('limit', hard, flush=True)
resource.setrlimit(resource.RLIMIT_CPU, (int(time.process_time()) + 1, hard))
while True:
    pass";
    let r = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(
        (&r["verdict"], &r["timed_out"], &r["stdout"]),
        (&json!("timeout"), &json!(true), &json!("limit 62\n")),
        "{r}"
    );
    let said = "the run's worker used up its CPU time (all its threads together; its limit is \
                limits.max_timeout_ms and a second, a backstop behind the time limit) and was \
                killed by signal 24 (SIGXCPU) before its timeout of 60000 ms came";
    assert_eq!(
        r["error"],
        json!({"type": "TimeoutError", "message": said}),
        "{r}"
    );
    assert!(
        r["duration_ms"].as_u64().unwrap() < 60_000,
        "ended by its CPU time, long before the clock: {r}"
    );
}
