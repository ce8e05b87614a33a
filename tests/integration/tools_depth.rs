//! How deep a tool call's JSON may nest (64 levels, `MAX_TOOL_JSON_DEPTH`), end to end: an
//! argument nested deeper raises `ToolLimitError` before anything is sent and the session
//! lives on (before, the supervisor could not decode the call and killed the worker); a
//! hand-made frame deeper than a worker sends kills only that worker; a caller's answer
//! nested deeper is a 400 naming the limit, and an HTTP or MCP tool's result a
//! `ToolLimitError`; a thread with a 32 KiB stack carries JSON nested to the limit.

use axum::Json;
use axum::extract::Query;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::harness::{Options, Server};
use crate::streamed::Events;
use crate::tools_concurrent::stdout;

/// The service behind the HTTP tools: `echo` answers its arguments, `deep` a JSON array
/// nested `levels` deep (as text: deeper than serde_json makes values).
async fn tool_service() -> String {
    let app = axum::Router::new()
        .route(
            "/echo",
            post(|Json(args): Json<Value>| async move { Json(args) }),
        )
        .route(
            "/deep",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let levels: usize = q["levels"].parse().unwrap();
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        format!("{}0{}", "[".repeat(levels), "]".repeat(levels)),
                    )
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn server() -> (Server, tempfile::TempDir) {
    let base = tool_service().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[tools]
call_timeout_ms = 30000

[[tools.http]]
name = "echo"
description = "Answers its arguments"
url = "{base}/echo"
method = "POST"

[[tools.http]]
name = "deep"
description = "A list nested `levels` deep"
parameters = {{ type = "object", properties = {{ levels = {{ type = "integer" }} }} }}
url = "{base}/deep"
method = "GET"
"#
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let server =
        Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;
    (server, dir)
}

/// Python that builds `nested(n)`, a list nested `n` levels deep.
const NESTED: &str = "def nested(n):
    v = 0
    for _ in range(n):
        v = [v]
    return v
";

/// The reported case: an argument 126 levels deep passed the worker's checks, the
/// supervisor could not decode the frame, and killed the worker, its session lost. Now each
/// deeper argument (one level past the limit, the reported 126, and deeper than the
/// encoder goes) raises `ToolLimitError` unsent, by `tools.call` and `tools.aio` alike,
/// and the session goes on with its state; 64 levels go out.
#[tokio::test]
async fn an_argument_nested_past_the_limit_raises_a_limit_error_and_the_session_lives() {
    let (s, _dir) = server().await;
    let id = s.new_session().await;
    let code = format!(
        "{NESTED}from snakecage import tools
kept = 'still here'
for levels in (65, 126):
    try:
        tools.echo(flat=1, v=nested(levels))
        print('sent')
    except tools.ToolLimitError as e:
        print(type(e).__name__, e.kind, e.tool, '|', e)
try:
    await tools.aio.echo(v=nested(126))
except tools.ToolLimitError as e:
    print('aio', e.kind)
try:
    tools.echo(v=nested(100_000))
except tools.ToolLimitError as e:
    print(e.kind, e)
print(tools.echo(v=nested(63)) == {{'v': nested(63)}}, tools.MAX_JSON_DEPTH)
try:
    tools.echo(v=nested(64))
except tools.ToolLimitError as e:
    print('back:', e)"
    );
    let body = s.session_run(&id, &code).await;
    let limit = "deeper than the 64 levels a tool's arguments and results may nest (arrays \
                 and objects within one another)";
    assert_eq!(
        stdout(&body),
        format!(
            "ToolLimitError limit echo | argument 'v' of tool 'echo' is nested 65 levels deep, \
             {limit}; flatten it, or pass it as a JSON string\n\
             ToolLimitError limit echo | argument 'v' of tool 'echo' is nested 126 levels deep, \
             {limit}; flatten it, or pass it as a JSON string\n\
             aio limit\n\
             limit arguments of tool 'echo' are nested too deep to be encoded, {limit}; \
             flatten them, or pass them as a JSON string\n\
             True 64\n\
             back: the tool's result is nested 65 levels deep, {limit}\n"
        ),
        "{body}"
    );
    assert_eq!(body["verdict"], "ok", "{body}");
    let body = s.session_run(&id, "print(kept)").await;
    assert_eq!(stdout(&body), "still here\n", "{body}");
    // Only the calls within the limit reached the tool: 63 levels, and 64, whose echo (its
    // object around it) was one too deep to come back.
    let metrics = s.get("/metrics").await.2;
    for outcome in ["ok", "limit"] {
        assert!(
            metrics.contains(&format!(
                r#"snakecage_tool_calls_total{{outcome="{outcome}",provider="http",tool="echo"}} 1"#
            )),
            "{metrics}"
        );
    }
}

/// Code that writes a call to the job socket itself, nested past what a worker sends: one
/// the supervisor decodes and refuses (100 levels), and one a million levels deep (2 MB of
/// brackets) that it stops reading at its frame codec's depth. Each kills only its own
/// worker, at once, and the service goes on.
#[tokio::test]
async fn a_hand_made_call_deeper_than_a_worker_sends_kills_only_its_worker() {
    let (s, _dir) = server().await;
    let frame = |levels: usize| {
        format!(
            "import os, time
m = b'{{\"type\": \"tool_call\", \"id\": 1, \"name\": \"echo\", \"arguments\": {{\"v\": ' + b'[' * {levels} + b']' * {levels} + b'}}}}'
os.write(3, len(m).to_bytes(4, 'little') + m)
time.sleep(60)"
        )
    };
    for (levels, why) in [
        (
            100,
            "a tool call with an argument nested 100 levels deep, past the 64 a worker sends",
        ),
        (1_000_000, "bytes that are not a frame"),
    ] {
        let body = s
            .run_with(json!({"code": frame(levels), "timeout_ms": 60000}))
            .await;
        assert_eq!(body["verdict"], "killed", "{body}");
        assert_eq!(
            body["stderr"],
            format!(
                "\nThe worker broke the job protocol and was killed: its job socket (fd 3) \
                 carried {why}, which is what a job writing to fd 3 causes."
            ),
            "{body}"
        );
    }
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(r#"snakecage_workers_killed_total{reason="protocol_violation"} 2"#),
        "{metrics}"
    );
    let body = s.run("print('weiter')").await;
    assert_eq!(stdout(&body), "weiter\n", "{body}");
}

/// An HTTP tool whose result nests past the limit: parsed (70 levels) or too deep to parse
/// (10,000), the program gets `ToolLimitError` saying how deep; 64 levels come back whole.
#[tokio::test]
async fn an_http_tool_result_nested_past_the_limit_is_a_limit_error() {
    let (s, _dir) = server().await;
    let code = format!(
        "{NESTED}from snakecage import tools
for levels in (70, 10_000):
    try:
        tools.deep(levels=levels)
    except tools.ToolLimitError as e:
        print(e.kind, e)
print(tools.deep(levels=64) == nested(64))"
    );
    let body = s.run_with(json!({"code": code})).await;
    let limit = "deeper than the 64 levels a tool's arguments and results may nest (arrays \
                 and objects within one another)";
    assert_eq!(
        stdout(&body),
        format!(
            "limit the tool's result is nested 70 levels deep, {limit}\n\
             limit the tool's result is nested 10000 levels deep, {limit}\n\
             True\n"
        ),
        "{body}"
    );
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(
            r#"snakecage_tool_calls_total{outcome="limit",provider="http",tool="deep"} 2"#
        ),
        "{metrics}"
    );
}

/// A caller's answer nested past the limit (a result of 65 levels, of 300, more than the
/// body parser takes, and error data of 70) is a 400 whose `detail` names the depth and
/// the limit; the call still waits, and an answer within the limit is delivered.
#[tokio::test]
async fn a_caller_answer_nested_past_the_limit_is_a_400_and_the_call_still_waits() {
    let (s, _dir) = server().await;
    let code = format!(
        "{NESTED}from snakecage import tools
print(tools.lookup(q='x') == nested(64))"
    );
    let tools = json!([{"name": "lookup", "description": "Answered by the caller"}]);
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({"code": code, "tools": tools, "timeout_ms": 60000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut events = Events::new(resp);
    let nested = |levels: usize| (0..levels).fold(json!(0), |inner, _| json!([inner]));
    let mut result = Value::Null;
    while let Some((event, data)) = events.next().await {
        match event.as_str() {
            "tool_call" => {
                let url = format!(
                    "{}/v1/runs/{run_id}/tool_calls/{}",
                    s.base,
                    data["call_id"].as_str().unwrap()
                );
                let post = |body: String| {
                    s.client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                };
                let too_deep = [
                    (
                        json!({"result": nested(65)}).to_string(),
                        "the answer's `result` is nested 65 levels deep",
                    ),
                    (
                        format!("{{\"result\": {}0{}}}", "[".repeat(300), "]".repeat(300)),
                        "the answer (its own object included) is nested 301 levels deep",
                    ),
                    (
                        json!({"error": {"message": "m", "data": nested(70)}}).to_string(),
                        "the answer's `error.data` is nested 70 levels deep",
                    ),
                ];
                for (body, says) in too_deep {
                    let resp = post(body).await.unwrap();
                    assert_eq!(resp.status(), 400);
                    let body: Value = resp.json().await.unwrap();
                    assert_eq!(body["code"], "bad_request", "{body}");
                    assert_eq!(
                        body["detail"],
                        format!(
                            "{says}, deeper than the 64 levels a tool's result or error data \
                             may nest (arrays and objects within one another); the call still \
                             waits for an answer: send one less deep, or an error"
                        ),
                        "{body}"
                    );
                }
                let resp = post(json!({"result": nested(64)}).to_string())
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 204);
            }
            "result" => {
                result = data;
                break;
            }
            _ => {}
        }
    }
    assert_eq!(result["stdout"], "True\n", "{result}");
    assert_eq!(result["verdict"], "ok", "{result}");
}

/// An upstream MCP server's result nested past the limit: structured content `{"v": [70
/// levels]}` (its JSON-RPC response 74 deep, which the MCP client still parses) and text
/// that is JSON 10,000 levels deep are each a `ToolLimitError` saying how deep. (Structured
/// content past what the MCP client parses, about 125 levels, never reaches snakecage: see the
/// README.)
#[tokio::test]
async fn an_mcp_tool_result_nested_past_the_limit_is_a_limit_error() {
    let dir = tempfile::tempdir().unwrap();
    let python = crate::harness::repo_root().join(".venv-tools/bin/python");
    let script = crate::harness::repo_root().join("tests/clients/mcp_deep.py");
    let config = format!(
        "[tools]\ncall_timeout_ms = 5000\n\n[[tools.mcp]]\nname = \"up\"\ncommand = [\"{}\", \"{}\"]\n",
        python.display(),
        script.display()
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let s = Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;
    let code = format!(
        "{NESTED}from snakecage import tools
for call in (lambda: tools.up_nest(levels=70), lambda: tools.up_nest_text(levels=10_000)):
    try:
        call()
    except tools.ToolError as e:
        print(type(e).__name__, e)
print(tools.up_nest(levels=63) == {{'v': nested(63)}})"
    );
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    let limit = "deeper than the 64 levels a tool's arguments and results may nest (arrays \
                 and objects within one another)";
    assert_eq!(
        stdout(&body),
        format!(
            "ToolLimitError the tool's result is nested 71 levels deep, {limit}\n\
             ToolLimitError the tool's result is nested 10000 levels deep, {limit}\n\
             True\n"
        ),
        "{body}"
    );
}

/// A thread with the smallest stack Python allows (32 KiB) calls a tool with an argument
/// nested to the limit and gets an answer as deep back (before, the worker's Rust half
/// recursed per level on that stack, and 8 levels killed the worker with SIGSEGV).
#[tokio::test]
async fn a_thread_with_the_smallest_stack_sends_and_reads_json_nested_to_the_limit() {
    let (s, _dir) = server().await;
    let code = format!(
        "{NESTED}import threading
from snakecage import tools
threading.stack_size(32 * 1024)
out = []
def call():
    for levels in (8, 32, 63):
        out.append(tools.echo(v=nested(levels)) == {{'v': nested(levels)}})
    out.append(tools.deep(levels=64) == nested(64))
t = threading.Thread(target=call)
t.start()
t.join()
print(out)"
    );
    let body = s.run_with(json!({"code": code})).await;
    assert_eq!(stdout(&body), "[True, True, True, True]\n", "{body}");
    assert_eq!(body["verdict"], "ok", "{body}");
}
