//! Machine-readable errors: every error path answers `detail` plus a `code` from README.md's
//! table, with the status the table gives it (the harness checks every error it sees).

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Server, check_error_body};

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
