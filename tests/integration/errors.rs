//! Machine-readable errors: every error path answers `detail` plus a `code` from README.md's
//! table, with the status the table gives it (the harness checks every error it sees).

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Server, check_error_body, documented_error_meaning, repo_root};

async fn send(req: reqwest::RequestBuilder) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        headers,
    )
}

async fn expect(req: reqwest::RequestBuilder, status: u16, code: &str) -> Value {
    let (got, body, _) = send(req).await;
    assert_eq!(got, status, "{body}");
    assert_eq!(check_error_body(status, &body), code, "{body}");
    body
}

#[tokio::test]
async fn every_error_path_carries_a_documented_code() {
    let s = Server::start().await;
    let c = &s.client;
    let url = |p: &str| format!("{}{p}", s.base);

    expect(c.get(url("/v1/nope")), 404, "not_found").await;
    // An unknown run is `not_found` too, and the table says so (not only "no such route").
    expect(c.delete(url("/v1/runs/run_nope")), 404, "not_found").await;
    expect(
        c.post(url("/v1/runs/run_nope/tool_calls/call_1"))
            .json(&json!({"result": 1})),
        404,
        "not_found",
    )
    .await;
    let meaning = documented_error_meaning("not_found");
    assert!(
        meaning.contains("no such run") && meaning.contains("another key's"),
        "{meaning}"
    );
    expect(c.get(url("/v1/files/nope")), 404, "file_not_found").await;
    let body = expect(
        c.post(url("/v1/execute"))
            .json(&json!({"code": "1", "files": [{"path": "a.txt", "file_id": "nope"}]})),
        404,
        "file_not_found",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("nope"), "{body}");
    expect(
        c.get(url("/v1/sessions/sess_nope")),
        404,
        "session_not_found",
    )
    .await;
    expect(
        c.post(url("/v1/sessions/sess_nope/execute"))
            .json(&json!({"code": "1"})),
        404,
        "session_not_found",
    )
    .await;

    // The router's own 405 keeps its Allow header and gets the JSON body.
    let (status, body, headers) = send(c.post(url("/v1/tools"))).await;
    assert_eq!(status, 405);
    assert_eq!(check_error_body(status, &body), "method_not_allowed");
    assert!(headers.get("allow").is_some(), "{headers:?}");
    // An extractor's rejection too.
    let body = expect(c.get(url("/v1/tools?format=xml")), 400, "bad_request").await;
    assert!(
        body["detail"].as_str().unwrap().contains("anthropic"),
        "{body}"
    );

    expect(
        c.post(url("/v1/execute"))
            .json(&json!({"code": "1", "timeout_ms": 60001})),
        422,
        "timeout_too_large",
    )
    .await;
    expect(
        c.post(url("/v1/execute"))
            .json(&json!({"code": "1", "bogus": 1, "entrypoint": "x"})),
        422,
        "invalid_request",
    )
    .await;

    // Sessions: busy, not implemented, gone.
    let (status, created) = s.post("/v1/sessions", &json!({"ttl_seconds": 2})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["session_id"].as_str().unwrap().to_owned();
    expect(
        c.post(url(&format!("/v1/sessions/{sid}/bash"))),
        501,
        "not_implemented",
    )
    .await;
    let slow = {
        let req = c
            .post(url(&format!("/v1/sessions/{sid}/execute")))
            .json(&json!({"code": "import time\ntime.sleep(1.5)"}));
        tokio::spawn(req.send())
    };
    // Wait until the slow run holds the session.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, info) = s.get_json("/v1/sessions").await;
        if info["sessions"][0]["status"] == "busy" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    expect(
        c.post(url(&format!("/v1/sessions/{sid}/execute")))
            .json(&json!({"code": "1"})),
        409,
        "session_busy",
    )
    .await;
    assert_eq!(slow.await.unwrap().unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let body = expect(
        c.post(url(&format!("/v1/sessions/{sid}/execute")))
            .json(&json!({"code": "1"})),
        410,
        "session_gone",
    )
    .await;
    assert!(
        body["detail"].as_str().unwrap().contains("expired"),
        "{body}"
    );

    // A run that fails is a 200 with a verdict, never an error body.
    let r = s
        .run_with(json!({"code": "import time\ntime.sleep(5)", "timeout_ms": 200}))
        .await;
    assert_eq!(r["verdict"], "timeout");
    assert!(r.get("code").is_none(), "{r}");
}

#[tokio::test]
async fn an_error_after_a_stream_started_is_an_error_event_with_its_code() {
    let s = Server::start().await;
    let (status, created) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = created["session_id"].as_str().unwrap().to_owned();
    let started = std::time::Instant::now();
    let resp = s
        .client
        .post(format!("{}/v1/sessions/{sid}/execute/stream", s.base))
        .json(&json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(30)", "timeout_ms": 60000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let deleter = {
        let client = s.client.clone();
        let url = format!("{}/v1/sessions/{sid}", s.base);
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            client.delete(url).send().await.unwrap().status()
        }
    };
    let (events, deleted) = tokio::join!(
        crate::stream::read_events(resp, started, |e| e.event == "error" || e.event == "result"),
        deleter
    );
    assert_eq!(deleted, 204);
    let last = events.last().unwrap();
    assert_eq!(last.event, "error", "{:?}", last.data);
    assert_eq!(last.data["code"], "session_gone", "{:?}", last.data);
    assert!(
        last.data["message"].as_str().unwrap().contains("deleted"),
        "{:?}",
        last.data
    );
}

/// What a newcomer meets first: a browser's GET on a POST route, a body over the limit, a
/// body that is not JSON. Each answer says what to do instead.
#[tokio::test]
async fn refusals_a_newcomer_meets_say_what_to_do_instead() {
    let s = Server::start_with(
        crate::harness::Options::default().env("SNAKECAGE_LIMITS__MAX_REQUEST_BYTES", 4096),
    )
    .await;
    let c = &s.client;
    let url = |p: &str| format!("{}{p}", s.base);

    // 405 names the method, the route and the method to use.
    let body = expect(c.get(url("/v1/execute")), 405, "method_not_allowed").await;
    assert_eq!(
        body["detail"], "GET is not allowed on /v1/execute; use POST",
        "{body}"
    );
    let body = expect(c.put(url("/v1/sessions")), 405, "method_not_allowed").await;
    assert_eq!(
        body["detail"], "PUT is not allowed on /v1/sessions; use one of POST, GET",
        "{body}"
    );

    // 413 names the limit and its key, on every route that takes a JSON body.
    let big = json!({ "code": format!("s = '{}'", "x".repeat(5000)) });
    let sid = s.new_session().await;
    for path in [
        "/v1/execute".to_owned(),
        "/v1/execute/stream".to_owned(),
        "/v1/sessions".to_owned(),
        format!("/v1/sessions/{sid}/execute"),
    ] {
        let body = expect(c.post(url(&path)).json(&big), 413, "payload_too_large").await;
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("4096 bytes") && detail.contains("limits.max_request_bytes"),
            "{path}: {body}"
        );
    }

    // A body that is not JSON is 400 on every JSON route, sessions included.
    for path in ["/v1/execute", "/v1/sessions"] {
        let req = c
            .post(url(path))
            .header("content-type", "application/json")
            .body("print(1)");
        let body = expect(req, 400, "bad_request").await;
        assert!(
            body["detail"].as_str().unwrap().contains("not valid JSON"),
            "{path}: {body}"
        );
    }
}

/// `timeout_ms` and `ttl_seconds` given as floats, as a client whose numbers are all
/// floats (or a model's tool call passed on as it came) sends them: a whole one is taken,
/// a fraction or a negative one is a 422 that says a whole number is wanted.
#[tokio::test]
async fn whole_numbers_sent_as_floats_are_taken_and_fractions_refused() {
    let s = Server::start().await;
    let r = s
        .run_with(
            json!({"code": "import time\ntime.sleep(0.2)\nprint('done')", "timeout_ms": 5000.0}),
        )
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let (status, created) = s.post("/v1/sessions", &json!({"ttl_seconds": 60.0})).await;
    assert_eq!(status, 201, "{created}");

    for (path, body) in [
        ("/v1/execute", json!({"code": "1", "timeout_ms": 1.5})),
        ("/v1/execute", json!({"code": "1", "timeout_ms": -1})),
        ("/v1/sessions", json!({"ttl_seconds": 0.5})),
    ] {
        let (status, r) = s.post(path, &body).await;
        assert_eq!(status, 422, "{body}: {r}");
        assert_eq!(r["code"], "invalid_request", "{r}");
        assert!(
            r["detail"].as_str().unwrap().contains("whole number"),
            "{body}: {r}"
        );
    }
}

/// A client that writes every unset optional field as `null` (a pydantic model's dump)
/// gets each field's default, on every field alike.
#[tokio::test]
async fn null_for_an_optional_field_means_not_given() {
    let s = Server::start().await;
    let r = s
        .run_with(json!({
            "code": "print('é', 40 + 2)\n'shown'",
            "entrypoint": null, "args": null, "stdin": null, "timeout_ms": null,
            "last_line_interactive": null, "files": null, "code_format": null, "tools": null,
        }))
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(r["stdout"], "é 42\n'shown'\n", "{r}");
    assert_eq!(r["results"], json!([{"text/plain": "'shown'"}]), "{r}");
    let (status, created) = s
        .post(
            "/v1/sessions",
            &json!({"files": null, "ttl_seconds": null, "replay": null}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["replay"], false, "{created}");
    let sid = created["session_id"].as_str().unwrap();
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": "x = 1\nx", "files": null, "args": null, "code_format": null}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["results"], json!([{"text/plain": "1"}]), "{r}");
}

/// Bodies a client gets subtly wrong: each is refused with a detail that names what to fix,
/// where before some were run as if the mistake were not there.
#[tokio::test]
async fn a_body_of_the_wrong_shape_is_refused_naming_what_to_fix() {
    let s = Server::start().await;
    let c = &s.client;
    let url = |p: &str| format!("{}{p}", s.base);
    let sid = s.new_session().await;
    let detail = |body: &Value| body["detail"].as_str().unwrap().to_owned();

    // A misspelt field: before, the run went ahead with the default timeout.
    for (path, body, field) in [
        (
            "/v1/execute".to_owned(),
            json!({"code": "print('été')", "timout_ms": 10_000}),
            "timout_ms",
        ),
        (
            format!("/v1/sessions/{sid}/execute"),
            json!({"code": "x = 1", "délai": 1}),
            "délai",
        ),
        (
            "/v1/execute".to_owned(),
            json!({"code": "1", "files": [{"path": "a.csv", "file_id": "f", "mode": "r"}]}),
            "mode",
        ),
    ] {
        let r = expect(c.post(url(&path)).json(&body), 422, "invalid_request").await;
        let d = detail(&r);
        assert!(
            d.contains(&format!("unknown field `{field}`")),
            "{path}: {r}"
        );
        assert!(d.contains("expected"), "{path}: {r}");
    }

    // JSON that is not an object: an array was read field by field (`code` first) and run.
    // The refusal sketches the object the endpoint takes (a session has no `code`).
    for (path, body, what) in [
        (
            "/v1/execute",
            r#"["print('ran')"]"#,
            r#"({"code": ...}), not an array"#,
        ),
        ("/v1/execute/stream", r#"["print('ran')"]"#, "not an array"),
        ("/v1/execute", r#""print('ran')""#, "not a string"),
        (
            "/v1/sessions",
            "[null, 60]",
            r#"({"ttl_seconds": ..., "files": [...]}, or no body), not an array"#,
        ),
        ("/v1/sessions", "42", "not a number"),
    ] {
        let req = c
            .post(url(path))
            .header("content-type", "application/json")
            .body(body);
        let r = expect(req, 422, "invalid_request").await;
        let d = detail(&r);
        assert!(
            d.contains("must be a JSON object") && d.contains(what),
            "{path} {body}: {r}"
        );
    }

    // A whole number too large for any limit is judged by the field's own limit.
    for n in ["1e20", "100000000000000000000", "18446744073709551616"] {
        let req = c
            .post(url("/v1/execute"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"code": "1", "timeout_ms": {n}}}"#));
        let r = expect(req, 422, "timeout_too_large").await;
        assert!(detail(&r).contains("60000"), "{n}: {r}");
    }
    let r = expect(
        c.post(url("/v1/sessions"))
            .json(&json!({"ttl_seconds": 1e20})),
        422,
        "invalid_request",
    )
    .await;
    assert!(detail(&r).contains("exceeds maximum"), "{r}");

    // A session's body names the field that is wrong, as an execute's does.
    for (body, field) in [
        (json!({"ttl_seconds": -5}), "ttl_seconds"),
        (json!({"replay": 1}), "replay"),
        (json!({"files": "données.csv"}), "files"),
        (json!({"files": [{"path": "a.csv"}]}), "files[0]"),
    ] {
        let r = expect(
            c.post(url("/v1/sessions")).json(&body),
            422,
            "invalid_request",
        )
        .await;
        assert!(detail(&r).contains(field), "{body}: {r}");
    }

    // A JSON string with a lone surrogate escape (Python's json.dumps of surrogateescape'd
    // text) cannot be read; the detail says what to do about it.
    let req = c
        .post(url("/v1/execute"))
        .header("content-type", "application/json")
        .body(r#"{"code": "print(\"\udcff\")"}"#);
    let r = expect(req, 400, "bad_request").await;
    assert!(
        detail(&r).contains("valid Unicode") && detail(&r).contains("U+FFFD"),
        "{r}"
    );
    // The leading half of a pair, alone (serde_json: "unexpected end of hex escape").
    let req = c
        .post(url("/v1/execute"))
        .header("content-type", "application/json")
        .body(r#"{"code": "\ud800"}"#);
    let r = expect(req, 400, "bad_request").await;
    assert!(
        detail(&r).contains("valid Unicode") && detail(&r).contains("U+FFFD"),
        "{r}"
    );

    // A code_format that is not a string is a field with a bad value (422 naming the
    // formats), not a body that is not JSON.
    for bad in [json!(5), json!({}), json!(["python"]), json!("PYTHON")] {
        let req = c
            .post(url("/v1/execute"))
            .json(&json!({"code": "print(1)", "code_format": bad}));
        let r = expect(req, 422, "invalid_request").await;
        assert!(detail(&r).contains("code_format"), "{bad}: {r}");
        if bad.is_string() {
            assert!(detail(&r).contains("`python` or `markdown`"), "{bad}: {r}");
        }
    }

    // An upload that is not multipart says how to send one, not which boundary is missing.
    let req = c
        .post(url("/v1/files"))
        .header("content-type", "application/octet-stream")
        .body("a,b\n1,2\n");
    let r = expect(req, 415, "unsupported_media_type").await;
    assert!(
        detail(&r).contains("not a application/octet-stream body")
            && detail(&r).contains("-F file=@"),
        "{r}"
    );
    assert!(!detail(&r).contains("boundary"), "{r}");
    let r = expect(c.post(url("/v1/files")), 415, "unsupported_media_type").await;
    assert!(detail(&r).contains("no Content-Type"), "{r}");

    // A compressed body (`{"code": "print(1)"}` gzipped) is refused as compressed (415 naming the coding, and what is
    // accepted), not parsed as if plain: JSON, an upload, an MCP message.
    let gzip_of_json = [
        0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xab, 0x56, 0x4a, 0xce, 0x4f,
        0x49, 0x55, 0xb2, 0x52, 0x50, 0x2a, 0x28, 0xca, 0xcc, 0x2b, 0xd1, 0x30, 0xd4, 0x54, 0xaa,
        0x05, 0x00, 0xc0, 0xda, 0x65, 0xf8, 0x14, 0x00, 0x00, 0x00,
    ];
    for (path, content_type, coding) in [
        ("/v1/execute", "application/json", "gzip"),
        ("/v1/execute", "application/json", "identity, br"),
        ("/v1/files", "multipart/form-data; boundary=x", "gzip"),
        ("/mcp", "application/json", "deflate"),
    ] {
        let req = c
            .post(url(path))
            .header("content-type", content_type)
            .header("accept", "application/json, text/event-stream")
            .header("content-encoding", coding)
            .body(gzip_of_json.to_vec());
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 415, "{path} {coding}");
        assert_eq!(resp.headers()["accept-encoding"], "identity", "{path}");
        let r: Value = resp.json().await.unwrap();
        assert_eq!(r["code"], "unsupported_media_type", "{path}: {r}");
        let named = coding.trim_start_matches("identity, ");
        assert!(
            detail(&r).contains(&format!("Content-Encoding \"{named}\""))
                && detail(&r).contains("without compression"),
            "{path}: {r}"
        );
    }
    // `identity` is no coding at all.
    let resp = c
        .post(url("/v1/execute"))
        .header("content-encoding", "identity")
        .json(&json!({"code": "print('ünï')"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn tool_and_key_names_are_refused_by_the_rule_the_readme_states() {
    const RULE: &str = "1 to 64 ASCII letters, digits, `_`, `-` or `.`";
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let readme = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    for (said_of, what) in [
        ("A key's name (its tenant's) is ", "keys"),
        ("A tool name, declared or the operator's, is ", "tools"),
    ] {
        assert!(
            readme.contains(&format!("{said_of}{RULE}")),
            "README.md states the rule for {what} names"
        );
    }
    // A declared tool: 422 naming the name and the rule.
    let s = Server::start().await;
    let (status, body) = s
        .post(
            "/v1/execute/stream",
            &json!({"code": "1", "tools": [{"name": "météo.ville-日本", "parameters": {"type": "object"}}]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"météo.ville-日本\" must be 1-64 ASCII letters, digits, '_', '-' or '.'"),
        "{detail}"
    );
    // A key: refused before anything is written.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "add", "jürgen", "--keys-file"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"jürgen\": a name is 1 to 64 characters, each an ASCII letter or digit"),
        "{stderr}"
    );
    assert!(!path.exists());
}
