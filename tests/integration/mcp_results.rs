//! What an MCP client reads of a run: every result small enough for the official SDK to
//! read (it refuses a server-sent event over 1 MiB), saying what was left out and how to get
//! it, and the facts an agent needs (a timeout's limit, files not stored, a progress bar as
//! a terminal shows it).

use serde_json::{Value, json};

use crate::agents::{mcp_client_with, texts};
use crate::harness::Server;

/// The official Python SDK's limit on one SSE event (`DEFAULT_MAX_SSE_EVENT_SIZE`).
const SDK_EVENT_LIMIT: usize = 1 << 20;

/// Both streams at their limits of control characters (six bytes of JSON each), a figure
/// whose PNG is over a megabyte and a dozen more of ~100 KB: ~10 MB of JSON in all.
const HUGE_RUN: &str = "import sys\nimport numpy as np, matplotlib.pyplot as plt\n\
    print('START')\nprint('\\x01' * 2_000_000)\nsys.stderr.write('\\x02' * 2_000_000)\n\
    rng = np.random.default_rng(0)\nplt.figure(figsize=(10, 10), dpi=100)\n\
    plt.scatter(rng.random(40_000), rng.random(40_000), s=1, c=rng.random(40_000))\n\
    for i in range(12):\n    plt.figure(figsize=(4, 4))\n    \
    plt.scatter(rng.random(3_000), rng.random(3_000), s=1, c=rng.random(3_000))\n";

/// POSTs one JSON-RPC message to `/mcp` as an MCP client does.
async fn post_mcp(s: &Server, message: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/mcp", s.base))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(message.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_mcp_result_fits_one_sse_event_of_the_official_sdk_and_says_what_it_left_out() {
    let s = Server::start().await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": HUGE_RUN, "timeout_ms": 60000}}});
    let response = post_mcp(&s, &call).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    // The event as the SDK measures it: its `data:` lines.
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter(|d| !d.trim().is_empty())
        .collect();
    assert_eq!(data.len(), 1, "one answer");
    assert!(
        data[0].len() < SDK_EVENT_LIMIT * 3 / 4 + (16 << 10),
        "an event of {} bytes",
        data[0].len()
    );
    let answer: Value = serde_json::from_str(data[0]).unwrap();
    let result = &answer["result"];
    assert_eq!(result["isError"], false, "{answer:.2000}");
    let all = texts(result);
    // The head and the tail of each stream, and a note that says what was cut and how to
    // get all of it.
    assert!(all.contains("--- stdout ---\nSTART\n\u{1}"), "{all:.300}");
    assert!(all.contains("\u{1}\n--- stderr ---\n\u{2}"), "{all:.300}");
    for stream in ["stdout", "stderr"] {
        assert!(
            all.contains(&format!(" characters of {stream} cut here"))
                && all.contains("write it to a file in the working directory"),
            "no note on {stream}"
        );
    }
    // Images while they fit; the big figure, and any past the budget, as a note with the
    // way to get it.
    let content = result["content"].as_array().unwrap();
    let images = content.iter().filter(|c| c["type"] == "image").count();
    assert!(images >= 1, "the small figures fit: {images}");
    assert!(all.contains("[output 1: an image/png of"), "{all:.300}");
    assert!(all.contains("plt.savefig(\"figure.png\")"));
    assert_eq!(
        images
            + all
                .matches("is left out: a tool result is kept under")
                .count(),
        13,
        "each figure is shown or named"
    );
}

#[tokio::test]
async fn the_official_sdk_reads_big_results_and_the_facts_an_agent_needs() {
    let s = Server::start().await;
    let base = s.base.clone();
    let r = tokio::task::spawn_blocking(move || mcp_client_with(&base, "bulky", &[]))
        .await
        .unwrap();
    for case in ["streams", "figures", "progress", "timeout", "skipped"] {
        assert!(r[case].get("failed").is_none(), "{case}: {}", r[case]);
    }
    let streams = texts(&r["streams"]);
    assert!(streams.contains("START\n") && streams.contains("ERRSTART\n"));
    assert!(streams.contains(" characters of stdout cut here"));

    let figures = &r["figures"]["content"];
    assert!(texts(&r["figures"]).contains("plotted"));
    assert!(texts(&r["figures"]).contains("[output 1: an image/png of"));
    assert_eq!(figures[2]["type"], "image", "{figures}");
    assert_eq!(figures[2]["png_magic"], true);

    // The bar as a terminal shows it: drawn fast, past limits.max_output_bytes, it is cut
    // in its middle; then its last frame and the answer.
    let progress = texts(&r["progress"]);
    assert!(
        progress.ends_with(
            " bytes truncated]...\n 99%|#######################################|\nANSWER = 42\n"
        ),
        "{progress}"
    );

    let timeout = texts(&r["timeout"]);
    assert_eq!(r["timeout"]["is_error"], true);
    assert!(
        timeout.contains(
            "error: TimeoutError: the run exceeded its timeout of 300 ms (timeout_ms; the most \
             allowed is 60000 ms, limits.max_timeout_ms)"
        ),
        "{timeout}"
    );

    let skipped = texts(&r["skipped"]);
    assert!(skipped.contains("kept.txt (file) file_id="), "{skipped}");
    assert!(
        skipped.contains(
            "--- files not stored (not in files; no file_id) ---\nlink: a symbolic link; only \
             regular files are stored\n"
        ),
        "{skipped}"
    );
}

#[tokio::test]
async fn mcp_calls_log_no_rmcp_chatter_and_a_failed_run_has_its_requests_id() {
    let s = Server::start().await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": "1 / 0"}}});
    let response = post_mcp(&s, &call).await;
    let id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(response.text().await.unwrap().contains("ZeroDivisionError"));
    let (_, status) = s.get_json("/v1/status").await;
    let failures = status["recent_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{status}");
    assert_eq!(failures[0]["request_id"], id.as_str(), "{status}");

    // An argument mistake is the client's (-32602), not a warning of the service.
    let mistake = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": "1", "stdin": "x"}}});
    let answer = post_mcp(&s, &mistake).await.text().await.unwrap();
    assert!(answer.contains("-32602"), "{answer}");
    // rmcp's INFO lines for each POST (one a dump of the client's parameters) and its WARN
    // for each error answer are filtered out; the service's own lines stay.
    let log = s.log();
    assert!(log.contains(r#""path":"/mcp""#), "{log}");
    let rmcp: Vec<&str> = log.lines().filter(|l| l.contains("rmcp::")).collect();
    assert!(rmcp.is_empty(), "{rmcp:#?}");
}
