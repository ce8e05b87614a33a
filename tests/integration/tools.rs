//! Code Mode end to end: sandboxed Python calls host tools (`from snakecage import tools`)
//! served by an HTTP tool on loopback and by the caller over SSE; limits, errors,
//! timeouts, cancellation, hostile frames, and the sandbox still closed with tools on.

use std::time::Duration;

use axum::Json;
use axum::extract::Query;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::harness::{Options, Server};

/// A loopback service behind the operator's HTTP tools.
async fn tool_service() -> String {
    let app = axum::Router::new()
        .route(
            "/weather",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let city = q.get("city").cloned().unwrap_or_default();
                    let temp = city.chars().count() as i64;
                    Json(json!({"city": city, "temp": temp}))
                },
            ),
        )
        .route(
            "/convert",
            post(|Json(body): Json<Value>| async move {
                let amount = body["amount"].as_f64().unwrap_or(0.0);
                (
                    axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({"message": "no rate for that currency", "amount": amount})),
                )
            }),
        )
        .route(
            "/moved",
            get(|| async { axum::response::Redirect::temporary("/weather?city=Moved") }),
        )
        .route(
            "/offsite",
            get(
                |axum::extract::State(port): axum::extract::State<u16>| async move {
                    axum::response::Redirect::temporary(&format!(
                        "http://localhost:{port}/weather?city=Far"
                    ))
                },
            ),
        )
        .route("/big", get(|| async { "x".repeat(100_000) }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(600)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app.with_state(addr.port());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn server_with_tools(extra: &str) -> (Server, tempfile::TempDir) {
    let base = tool_service().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[tools]
max_calls_per_run = 20
call_timeout_ms = 1500
max_result_bytes = 65536
{extra}

[[tools.http]]
name = "get_weather"
description = "Current temperature for a city"
parameters = {{ type = "object", properties = {{ city = {{ type = "string" }} }}, required = ["city"], additionalProperties = false }}
url = "{base}/weather"
method = "GET"

[[tools.http]]
name = "convert_currency"
description = "Convert an amount between currencies"
parameters = {{ type = "object", properties = {{ amount = {{ type = "number" }}, to = {{ type = "string" }} }}, required = ["amount", "to"] }}
url = "{base}/convert"

[[tools.http]]
name = "moved"
description = "Redirects to the same origin"
url = "{base}/moved"
method = "GET"

[[tools.http]]
name = "offsite"
description = "Redirects to another host"
url = "{base}/offsite"
method = "GET"

[[tools.http]]
name = "big"
description = "Answers more than max_result_bytes"
url = "{base}/big"
method = "GET"

[[tools.http]]
name = "slow_lookup"
description = "A lookup that never answers"
url = "{base}/slow"
method = "GET"
"#
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let server =
        Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;
    (server, dir)
}

#[tokio::test]
async fn a_program_searches_calls_in_a_loop_and_aggregates() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
found = tools.search('temperature city')
print([t['name'] for t in found][:1])
cities = ['Zürich', 'Genève', 'Bern']
temps = {c: tools.get_weather(city=c)['temp'] for c in cities}
print(sum(temps.values()), temps['Genève'])
print(tools.call('get_weather', city='東京')['city'])
print(sorted(t['name'] for t in tools.list()))";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "['get_weather']\n16 6\n東京\n['big', 'convert_currency', 'get_weather', 'moved', 'offsite', 'slow_lookup']\n",
        "{body}"
    );
    assert_eq!(body["exit_code"], 0);
    let (_, _, catalog) = s.get("/v1/tools/catalog?query=currency").await;
    let catalog: Value = serde_json::from_str(&catalog).unwrap();
    assert_eq!(catalog["tools"][0]["name"], "convert_currency", "{catalog}");
    // A model's markdown answer runs with the same tools.
    let answer = "Let me check.\n```python\nfrom snakecage import tools\nprint(tools.get_weather(city='Olten')['temp'])\n```\n";
    let body = s
        .run_with(json!({"code": answer, "code_format": "markdown"}))
        .await;
    assert_eq!(body["stdout"], "5\n", "{body}");
    // What a model is told names the tools and says how to use them.
    let (_, _, described) = s.get("/v1/tools").await;
    assert!(
        described.contains("from snakecage import tools"),
        "{described}"
    );
    assert!(
        described.contains("convert_currency (Convert an amount between currencies)"),
        "{described}"
    );
    let (_, _, status) = s.get("/v1/status").await;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["tools"]["calls"], 5, "{status}");
    assert_eq!(status["tools"]["configured"], 6, "{status}");
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(
            r#"snakecage_tool_calls_total{outcome="ok",provider="http",tool="get_weather"} 5"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_calls_raise_clear_python_exceptions() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
for call in (lambda: tools.get_weather(city=3), lambda: tools.get_weather(town='x'),
             lambda: tools.call('launch_missiles'), lambda: tools.nope(),
             lambda: tools.convert_currency(amount=5, to='XYZ')):
    try:
        call()
    except tools.ToolError as e:
        print(type(e).__name__, '|', e.message, '|', e.data)\n";
    let body = s.run(code).await;
    let lines: Vec<&str> = body["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines.len(), 5, "{body}");
    assert!(lines[0].starts_with("ToolArgumentsError | arguments of tool 'get_weather' do not match its schema: city: 3 is not of type \"string\""), "{}", lines[0]);
    assert!(
        lines[1].contains("ToolArgumentsError") && lines[1].contains("town"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(
            "UnknownToolError | unknown tool 'launch_missiles'; this run offers: get_weather"
        ),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].starts_with("UnknownToolError | unknown tool 'nope'"),
        "{}",
        lines[3]
    );
    assert_eq!(
        lines[4],
        "ToolError | tool 'convert_currency' answered HTTP 422 Unprocessable Entity | {'amount': 5.0, 'message': 'no rate for that currency'}"
    );
    // Redirects: followed to the same origin only; a response over max_result_bytes is
    // refused as it is read.
    let code = "from snakecage import tools\nprint(tools.moved()['city'])\nfor name in ('offsite', 'big'):\n    try:\n        tools.call(name)\n    except tools.ToolError as e:\n        print(type(e).__name__, e.message)\n";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "Moved\nToolError tool 'offsite' answered HTTP 307 Temporary Redirect\nToolLimitError the tool's response is larger than the 65536 bytes allowed (tools.max_result_bytes)\n",
        "{body}"
    );
    // Refused in the worker: nothing reached the supervisor for the first four.
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(r#"snakecage_tool_calls_total{outcome="failed",provider="http",tool="convert_currency"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains(r#"provider="none""#), "{metrics}");
}

#[tokio::test]
async fn the_call_limit_and_the_call_timeout_raise_and_the_run_goes_on() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
n = 0
try:
    while True:
        tools.get_weather(city='x'); n += 1
except tools.ToolLimitError as e:
    print(n, e.message)\n";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "20 this run has made its 20 tool calls (tools.max_calls_per_run); do more work per call\n",
        "{body}"
    );
    let code = "from snakecage import tools
try:
    tools.slow_lookup()
except tools.ToolTimeoutError as e:
    print(isinstance(e, TimeoutError), e.message)
print('after')";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "True tool 'slow_lookup' did not answer within 1500 ms (tools.call_timeout_ms)\nafter\n",
        "{body}"
    );
}

#[tokio::test]
async fn a_worker_that_sends_garbage_frames_is_killed_and_counted() {
    let (s, _dir) = server_with_tools("").await;
    // An oversized length prefix, then bytes that are no frame at all, on the job socket.
    for code in [
        "import os\nos.write(3, b'\\xff\\xff\\xff\\x7f' + b'garbage')\nimport time\ntime.sleep(5)",
        "import os\nos.write(3, b'\\x05\\x00\\x00\\x00{]x!!')\nimport time\ntime.sleep(5)",
        "import os, json\nm = json.dumps({'type': 'tool_call', 'id': 1, 'name': 'get_weather', 'arguments': {'city': 'x'}}).encode()\nf = len(m).to_bytes(4, 'little') + m\nos.write(3, f + f)\nimport time\ntime.sleep(5)",
    ] {
        let body = s.run(code).await;
        assert_eq!(body["verdict"], "killed", "{body}");
        assert_eq!(body["exit_code"], Value::Null, "{body}");
    }
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(r#"snakecage_workers_killed_total{reason="protocol_violation"} 3"#),
        "{metrics}"
    );
    assert_eq!(s.run("print('still fine')").await["stdout"], "still fine\n");
}

#[tokio::test]
async fn the_sandbox_stays_closed_with_tools_enabled() {
    let (s, _dir) = server_with_tools("").await;
    for (code, last) in [
        (
            "from snakecage import tools\nimport socket",
            "ImportError: import of 'socket' is not allowed in this sandbox",
        ),
        (
            "from snakecage import tools\nimport os\nos.system('id')",
            "PermissionError: 'os.system' is not allowed in this sandbox",
        ),
        (
            "from snakecage import tools\nimport _snakecage_tools",
            "ImportError: import of '_snakecage_tools' is not allowed in this sandbox",
        ),
    ] {
        let body = s.run(code).await;
        let stderr = body["stderr"].as_str().unwrap();
        assert_eq!(stderr.trim_end().lines().last(), Some(last), "{body}");
    }
}

/// Reads SSE events (`(event, data)`) from a streamed response.
struct Events {
    resp: reqwest::Response,
    buf: String,
}

impl Events {
    fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buf: String::new(),
        }
    }

    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut event = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        event = e.to_owned();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if event.is_empty() {
                    continue; // keep-alive comment
                }
                return Some((event, serde_json::from_str(&data).unwrap_or(Value::Null)));
            }
            let chunk = self.resp.chunk().await.ok()??;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

fn declared() -> Value {
    json!([
        {"type": "function", "function": {"name": "lookup_order", "description": "An order by id",
          "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}},
        {"name": "never_answered", "description": "The client never answers", "input_schema": {"type": "object"}}
    ])
}

#[tokio::test]
async fn caller_tools_are_answered_over_sse() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
total = 0
for i in range(1, 4):
    total += tools.lookup_order(id=i)['amount']
print('total', total)
try:
    tools.lookup_order(id=99)
except tools.ToolError as e:
    print('error', e.message, e.data)\n";
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({"code": code, "tools": declared()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut events = Events::new(resp);
    let mut result = Value::Null;
    let mut calls = 0;
    while let Some((event, data)) = events.next().await {
        match event.as_str() {
            "tool_call" => {
                calls += 1;
                assert_eq!(data["run_id"], run_id.as_str());
                assert_eq!(data["name"], "lookup_order");
                let id = data["arguments"]["id"].as_i64().unwrap();
                let answer = if id == 99 {
                    json!({"error": {"message": "no order 99", "data": {"id": 99}}})
                } else {
                    json!({"result": {"amount": id * 10}})
                };
                let url = format!(
                    "/v1/runs/{run_id}/tool_calls/{}",
                    data["call_id"].as_str().unwrap()
                );
                let (status, body) = s.post(&url, &answer).await;
                assert_eq!(status, 204, "{body}");
                if calls == 1 {
                    // A second answer to the same call is refused (the run still waits on
                    // later calls, so it is still there).
                    let (status, _) = s.post(&url, &answer).await;
                    assert_eq!(status, 409);
                }
            }
            "result" => {
                result = data;
                break;
            }
            "output" => {}
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    assert_eq!(calls, 4);
    assert_eq!(
        result["stdout"], "total 60\nerror no order 99 {'id': 99}\n",
        "{result}"
    );
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(
            r#"snakecage_tool_calls_total{outcome="ok",provider="caller",tool="caller"} 3"#
        ),
        "{metrics}"
    );

    // On plain /v1/execute nobody could answer them.
    let (status, body) = s
        .post("/v1/execute", &json!({"code": "1", "tools": declared()}))
        .await;
    assert_eq!(status, 422);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("/v1/execute/stream"),
        "{body}"
    );
    let (status, body) = s
        .post(
            "/v1/execute/stream",
            &json!({"code": "1", "tools": [{"name": "bad name"}]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
}

#[tokio::test]
async fn an_unanswered_call_times_out_and_a_deadline_cancels_a_pending_call() {
    let (s, _dir) = server_with_tools("").await;
    // Per-call timeout: the program gets ToolTimeoutError and finishes.
    let code = "from snakecage import tools
try:
    tools.never_answered()
except tools.ToolTimeoutError as e:
    print('timeout')\n";
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({"code": code, "tools": declared()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: tool_call"), "{text}");
    assert!(text.contains(r#""stdout":"timeout\n""#), "{text}");

    // The run's deadline (1 s) comes before the call's timeout (1.5 s): killed at once, the
    // pending call forgotten, the run gone.
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({"code": "from snakecage import tools\ntools.never_answered()", "tools": declared(), "timeout_ms": 1000}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut events = Events::new(resp);
    let mut call_id = String::new();
    let mut result = Value::Null;
    while let Some((event, data)) = events.next().await {
        match event.as_str() {
            "tool_call" => call_id = data["call_id"].as_str().unwrap().to_owned(),
            "result" => {
                result = data;
                break;
            }
            _ => {}
        }
    }
    assert_eq!(result["timed_out"], true, "{result}");
    assert!(!call_id.is_empty());
    let (status, _) = s
        .post(
            &format!("/v1/runs/{run_id}/tool_calls/{call_id}"),
            &json!({"result": 1}),
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_streamed_run_is_cancelled_by_delete() {
    let (s, _dir) = server_with_tools("").await;
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(60)", "timeout_ms": 60000}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut events = Events::new(resp);
    let (event, _) = events.next().await.unwrap();
    assert_eq!(event, "output");
    let del = |id: String| {
        let client = s.client.clone();
        let url = format!("{}/v1/runs/{id}", s.base);
        async move { client.delete(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(del("run_unknown".into()).await, 404);
    assert_eq!(del(run_id.clone()).await, 204);
    let mut result = Value::Null;
    while let Some((event, data)) = events.next().await {
        if event == "result" {
            result = data;
            break;
        }
    }
    assert_eq!(result["verdict"], "killed", "{result}");
    assert!(
        result["stderr"].as_str().unwrap().contains("cancelled"),
        "{result}"
    );
    assert_eq!(del(run_id).await, 404);
}

#[tokio::test]
async fn sessions_keep_tools_across_runs() {
    let (s, _dir) = server_with_tools("").await;
    let (status, session) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap();
    let path = format!("/v1/sessions/{id}/execute");
    let first_code = "from snakecage import tools\nw = tools.get_weather(city='Basel')";
    let (_, first) = s.post(&path, &json!({"code": first_code})).await;
    assert_eq!(first["exit_code"], 0, "{first}");
    let second_code = "print(w['temp'], tools.get_weather(city='Chur')['temp'])";
    let (_, second) = s.post(&path, &json!({"code": second_code})).await;
    assert_eq!(second["stdout"], "5 4\n", "{second}");
}

#[tokio::test]
async fn a_session_interrupted_while_a_call_is_pending_keeps_its_state() {
    let (s, _dir) = server_with_tools("").await;
    let (status, session) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap();
    let (_, first) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "from snakecage import tools\nkept = 'ja'"}),
        )
        .await;
    assert_eq!(first["exit_code"], 0, "{first}");
    // A declared tool nobody answers, past the run's 1 s deadline (the call's own timeout
    // is 1.5 s): the job is interrupted, its pending call answered `cancelled`.
    let resp = s
        .client
        .post(format!("{}/v1/sessions/{id}/execute/stream", s.base))
        .json(&json!({"code": "tools.never_answered()", "tools": declared(), "timeout_ms": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: tool_call"), "{text}");
    assert!(text.contains(r#""timed_out":true"#), "{text}");
    let (_, after) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "print(kept, tools.get_weather(city='Aarau')['temp'])"}),
        )
        .await;
    assert_eq!(after["stdout"], "ja 5\n", "{after}");
    // DELETE /v1/runs/{id} on a session's run interrupts it; the session lives on.
    let resp = s
        .client
        .post(format!("{}/v1/sessions/{id}/execute/stream", s.base))
        .json(&json!({"code": "import time\nprint('busy', flush=True)\ntime.sleep(30)", "timeout_ms": 60000}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let mut events = Events::new(resp);
    assert_eq!(events.next().await.unwrap().0, "output");
    let status = s
        .client
        .delete(format!("{}/v1/runs/{run_id}", s.base))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 204);
    let mut result = Value::Null;
    while let Some((event, data)) = events.next().await {
        if event == "result" {
            result = data;
            break;
        }
    }
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .contains("KeyboardInterrupt"),
        "{result}"
    );
    let (_, again) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "print(kept)"}),
        )
        .await;
    assert_eq!(again["stdout"], "ja\n", "{again}");
}

/// The same with the Python layer off: the OS layers stop raw sockets and process
/// creation while the program uses tools (ctypes reaches the syscalls directly).
#[tokio::test]
async fn with_the_python_layer_off_the_os_layers_still_close_the_sandbox_around_tools() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let base = tool_service().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[tools.http]]\nname = \"get_weather\"\ndescription = \"d\"\nurl = \"{base}/weather\"\nmethod = \"GET\"\n"
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_CONFIG", path.display())
            .env(
                "SNAKECAGE_SANDBOX__REQUIRE",
                r#"["network_namespace", "rlimits", "drop_privileges", "no_new_privs", "landlock", "seccomp"]"#,
            )
            .env("SNAKECAGE_SANDBOX__LAYERS_OFF", r#"["audit_hook", "import_guard"]"#),
    )
    .await;
    let code = "from snakecage import tools
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(tools.get_weather(city='Sion')['temp'])
for name, call in [('socket', lambda: libc.socket(2, 1, 0)), ('fork', lambda: libc.syscall(57)),
                   ('execve', lambda: libc.execve(b'/bin/sh', None, None))]:
    r = call()
    print(name, r, os.strerror(ctypes.get_errno()))
print(tools.get_weather(city='Thun')['temp'])";
    let body = s.run(code).await;
    assert_eq!(
        body["stdout"],
        "4\nsocket -1 Operation not permitted\nfork -1 Operation not permitted\nexecve -1 Operation not permitted\n4\n",
        "{body}"
    );
}
