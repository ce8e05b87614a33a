//! The MCP endpoint's own behaviour: stateless behind a round-robin load balancer, calls
//! that stop their run when their client leaves or cancels them, the request limit, and
//! protocol errors that say what is wrong. (The tools through the official SDK: agents.rs.)

use serde_json::{Value, json};

use crate::agents::{mcp_client_with, texts};
use crate::backing::Haproxy;
use crate::harness::{Server, check_error_body};
use crate::reliability::eventually;

/// Sums the samples of a metric whose line starts with `prefix` (`name{labels}` or `name`).
async fn metric(s: &Server, prefix: &str) -> f64 {
    let (_, _, text) = s.get("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// POSTs one JSON-RPC message to `/mcp` as an MCP client does; the status, the headers and
/// the answer (the first SSE `data:` of a stream, or the JSON body).
async fn rpc(
    base: &str,
    body: String,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let answer = match text.lines().find_map(|l| l.strip_prefix("data: ")) {
        Some(data) if !data.trim().is_empty() => serde_json::from_str(data).unwrap(),
        _ => serde_json::from_str(&text).unwrap_or(Value::String(text)),
    };
    (status, headers, answer)
}

fn call(id: Value, name: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
    .to_string()
}

#[tokio::test]
async fn mcp_works_through_a_round_robin_load_balancer_over_two_replicas() {
    let (a, b) = tokio::join!(Server::start(), Server::start());
    let backends: Vec<String> = [&a, &b]
        .iter()
        .map(|s| s.base.trim_start_matches("http://").to_owned())
        .collect();
    let lb = Haproxy::start(&backends);
    lb.wait_ready().await;

    // The official SDK: initialize, list, five calls, close; each request to the next replica.
    let base = lb.base.clone();
    let r = tokio::task::spawn_blocking(move || mcp_client_with(&base, "stateless", &[]))
        .await
        .unwrap();
    assert_eq!(r["hello"]["is_error"], false, "{}", r["hello"]);
    assert!(texts(&r["hello"]).contains("42"), "{}", r["hello"]);
    assert!(texts(&r["lines"]).contains("42"), "{}", r["lines"]);
    assert_eq!(r["error"]["is_error"], true, "{}", r["error"]);
    assert!(
        texts(&r["error"]).contains("ZeroDivisionError"),
        "{}",
        r["error"]
    );
    assert!(
        texts(&r["packages"]).contains("\"numpy\""),
        "{}",
        r["packages"]
    );
    assert_eq!(r["warnings"], json!([]), "the MCP client logged warnings");
    // Both replicas carried out tool calls.
    for s in [&a, &b] {
        let runs = metric(s, "snakecage_executions_total{").await;
        assert!(runs >= 1.0, "{} ran no tool call", s.base);
    }
}

#[tokio::test]
async fn an_mcp_call_whose_client_leaves_stops_its_run_at_once_and_logs_no_error() {
    let s = Server::start().await;
    let killed = r#"snakecage_workers_killed_total{reason="abandoned"}"#;
    let before = metric(&s, killed).await;
    let body = call(
        json!(1),
        "run_python",
        json!({"code": "import time\ntime.sleep(30)\nprint('fini')", "timeout_ms": 40000}),
    );
    let base = s.base.clone();
    let client = tokio::spawn(async move { rpc(&base, body, &[]).await });
    eventually(20, "the call's run started", async || {
        s.health().await["pool"]["busy"] == 1
    })
    .await;
    // The client goes away: its connection closes.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    // The run would take 30 s: its worker is killed and its slot free well before.
    eventually(15, "the abandoned call's worker is killed", async || {
        s.health().await["pool"]["busy"] == 0 && metric(&s, killed).await == before + 1.0
    })
    .await;
    // A client that leaves is normal: the call says it ended, and no ERROR is logged for
    // its answer that had no one to go to (rmcp's "failed to send pending response during
    // drain" was one).
    eventually(15, "the call's end is logged", async || {
        s.log().contains("an MCP call ended by its client")
    })
    .await;
    // The service goes on serving MCP (and by the time this call's answer is back, the
    // left call's answer has long been dropped).
    let (status, _, answer) = rpc(
        &s.base,
        call(
            json!("ü-2"),
            "run_python",
            json!({"code": "print('encore')"}),
        ),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert!(texts(&answer["result"]).contains("encore"), "{answer}");
    let errors: Vec<String> = s
        .log()
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["level"] == "ERROR"))
        .map(str::to_owned)
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[tokio::test]
async fn an_mcp_call_its_client_cancels_stops_its_run_and_the_client_goes_on() {
    let s = Server::start().await;
    let killed = r#"snakecage_workers_killed_total{reason="abandoned"}"#;
    let before = metric(&s, killed).await;
    // The official SDK gives up on the call once it runs (it sends notifications/cancelled on
    // a POST of its own and keeps the call's connection open), then watches /health.
    let base = s.base.clone();
    let r = tokio::task::spawn_blocking(move || mcp_client_with(&base, "cancel", &[]))
        .await
        .unwrap();
    assert_eq!(r["busy_while_running"], 1, "{r}");
    assert_eq!(r["gave_up"], true, "{r}");
    assert_eq!(
        r["busy_after_cancel"], 0,
        "the cancelled run kept its worker"
    );
    assert_eq!(metric(&s, killed).await, before + 1.0);
    assert!(texts(&r["after"]).contains("après"), "{}", r["after"]);

    // Only the client's own call: the same request id with another client's token does not
    // cancel it.
    let token = "mcp_0123456789abcdef";
    let body = call(
        json!("é-1"),
        "run_python",
        json!({"code": "import time\ntime.sleep(1)\nprint('fini')", "timeout_ms": 20000}),
    );
    let run = {
        let base = s.base.clone();
        tokio::spawn(async move { rpc(&base, body, &[("mcp-session-id", token)]).await })
    };
    eventually(10, "the run started", async || {
        s.health().await["pool"]["busy"] == 1
    })
    .await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": "é-1"}})
    .to_string();
    let (status, _, _) = rpc(&s.base, cancel, &[("mcp-session-id", "mcp_someone_else")]).await;
    assert_eq!(status, 202);
    let (status, _, answer) = run.await.unwrap();
    assert_eq!(status, 200);
    assert!(texts(&answer["result"]).contains("fini"), "{answer}");
}

#[tokio::test]
async fn mcp_reads_requests_up_to_the_limit_and_refuses_larger_ones_with_json_it_explains() {
    let s = Server::start().await;
    // Over rmcp's own 4 MiB default, within limits.max_request_bytes (10 MiB). Six
    // megabytes of source to hand over, decode and compile: seconds of wall-clock time on a
    // busy machine, past the default 2 s timeout, so the run gets the largest one.
    let code = format!("s = '{}'\nprint(len(s))", "é".repeat(3 << 20));
    let (status, _, answer) = rpc(
        &s.base,
        call(
            json!(1),
            "run_python",
            json!({"code": code, "timeout_ms": 60000}),
        ),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert!(texts(&answer["result"]).contains("3145728"), "{answer}");

    let code = "x".repeat(11 << 20);
    let (status, headers, body) = rpc(
        &s.base,
        call(json!(2), "run_python", json!({"code": code})),
        &[],
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(check_error_body(status, &body), "payload_too_large");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("over 10485760 bytes (limits.max_request_bytes)"),
        "{detail}"
    );
    // What an MCP client can do about it: it has no tool to upload a file.
    assert!(
        detail.contains("MCP has no tool to upload data: send less in one call"),
        "{detail}"
    );
    // The same object is a JSON-RPC error, which MCP clients show their user.
    assert_eq!(body["error"]["code"], -32600);
    assert_eq!(body["error"]["message"], detail);

    // The official SDK sees that message, and the descriptions state the limit.
    let base = s.base.clone();
    let r = tokio::task::spawn_blocking(move || mcp_client_with(&base, "large", &[]))
        .await
        .unwrap();
    assert!(texts(&r["within"]).contains("3145728"), "{}", r["within"]);
    assert!(
        r["over"]["message"]
            .as_str()
            .unwrap()
            .contains("limits.max_request_bytes"),
        "{}",
        r["over"]
    );
    assert!(
        r["run_python_description"]
            .as_str()
            .unwrap()
            .contains("up to 10485760 bytes"),
        "{}",
        r["run_python_description"]
    );
}

#[tokio::test]
async fn mcp_protocol_errors_say_what_is_wrong() {
    let s = Server::start().await;
    // Arguments that are not an object: invalid params, saying so.
    let (_, _, answer) = rpc(
        &s.base,
        call(json!(1), "run_python", json!("notanobject")),
        &[],
    )
    .await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`arguments` must be a JSON object"),
        "{message}"
    );
    assert!(message.contains("not a string"), "{message}");

    // Arguments the advertised schema does not name (`additionalProperties: false`).
    let (_, _, answer) = rpc(
        &s.base,
        call(
            json!(2),
            "run_python",
            json!({"code": "print('é')", "bogus": 1}),
        ),
        &[],
    )
    .await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown argument `bogus`; it takes code, files, timeout_ms"),
        "{answer}"
    );
    let (_, _, answer) = rpc(
        &s.base,
        call(json!(3), "list_packages", json!({"x": 1})),
        &[],
    )
    .await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown argument `x`; it takes no arguments"),
        "{answer}"
    );
    // Nothing ran for them.
    assert_eq!(metric(&s, "snakecage_executions_total{").await, 0.0);

    // A body that is not JSON: a JSON-RPC parse error, in the service's error shape too.
    let (status, _, body) = rpc(&s.base, "{\"jsonrpc\": \"2.0\", ".into(), &[]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(check_error_body(status, &body), "bad_request");
    assert_eq!(body["error"]["code"], -32700);
    assert!(
        body["detail"].as_str().unwrap().contains("not valid JSON"),
        "{body}"
    );

    // JSON that is not a JSON-RPC message, and a batch: a 400 saying so, not rmcp's 415
    // (the content type was right).
    for (body, says) in [
        (
            r#"{"foo": 1}"#,
            "not a JSON-RPC 2.0 request, notification or response",
        ),
        (
            r#"[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]"#,
            "batches are not supported",
        ),
    ] {
        let (status, _, answer) = rpc(&s.base, body.into(), &[]).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(check_error_body(status, &answer), "bad_request");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains(says),
            "{body}: {answer}"
        );
    }
    // A JSON-RPC response sent to the server: rmcp's refusal, with the service's fields.
    for body in [
        json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
        json!({"jsonrpc": "2.0", "id": "é", "error": {"code": 1, "message": "non"}}),
    ] {
        let (status, _, answer) = rpc(&s.base, body.to_string(), &[]).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(check_error_body(status, &answer), "bad_request");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert_eq!(answer["detail"], answer["error"]["message"], "{answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains("response"),
            "{answer}"
        );
    }
    // A request whose params are not an object: invalid params (-32602), to its own id.
    for (id, params, kind) in [
        (json!(9), json!("x"), "a string"),
        (json!("dix-é"), json!([1, 2]), "an array"),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let (status, _, answer) = rpc(&s.base, body.to_string(), &[]).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(check_error_body(status, &answer), "bad_request");
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        assert!(
            answer["detail"].as_str().unwrap().starts_with(&format!(
                "the `params` of \"tools/call\" are {kind}, not an object"
            )),
            "{answer}"
        );
    }

    // A Host that is not allowed: 403 naming the setting to change.
    let (status, headers, body) = rpc(
        &s.base,
        call(json!(4), "list_packages", json!({})),
        &[("host", "evil.example")],
    )
    .await;
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(status, 403, "{body}");
    assert_eq!(check_error_body(status, &body), "forbidden");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("mcp.allowed_hosts"),
        "{body}"
    );

    // An Accept that does not take an SSE stream: 406, with rmcp's reason, in JSON.
    let response = s
        .client
        .post(format!("{}/mcp", s.base))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(call(json!(5), "list_packages", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 406);
    let body: Value = response.json().await.unwrap();
    assert_eq!(check_error_body(406, &body), "not_acceptable");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("text/event-stream"),
        "{body}"
    );

    // GET (no standing stream: /mcp keeps no session): 405 in JSON, saying to POST.
    let (status, _, body) = s.get("/mcp").await;
    assert_eq!(status, 405, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(check_error_body(status, &body), "method_not_allowed");
    assert!(
        body["detail"].as_str().unwrap().contains("use POST"),
        "{body}"
    );

    // DELETE ends a session, named by its header: 200 with one (there is nothing to
    // close), 400 saying what is missing without.
    for (session, status) in [(Some("mcp_client-1"), 200), (None, 400)] {
        let mut request = s.client.delete(format!("{}/mcp", s.base));
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{session:?}");
        if status == 400 {
            let body: Value = response.json().await.unwrap();
            assert_eq!(check_error_body(400, &body), "bad_request");
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap()
                    .starts_with("DELETE /mcp ends the session its mcp-session-id header names"),
                "{body}"
            );
        }
    }

    // Only /mcp itself is the endpoint: a path below it is no route, and no call runs.
    let response = s
        .client
        .post(format!("{}/mcp/outils", s.base))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(call(json!(6), "run_python", json!({"code": "print(1)"})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(check_error_body(404, &body), "not_found");
    assert_eq!(metric(&s, "snakecage_executions_total{").await, 0.0);
}
