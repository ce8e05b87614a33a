//! `POST /v1/execute/stream` (SSE) and the rich `results` of a run.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::harness::{Server, process_exists};

/// One server-sent event, with when it arrived.
#[derive(Debug)]
pub struct SseEvent {
    pub event: String,
    pub data: Value,
    pub at: Duration,
}

/// Reads SSE events from `resp` until the stream ends, or until `stop` says so.
pub async fn read_events(
    resp: reqwest::Response,
    started: Instant,
    mut stop: impl FnMut(&SseEvent) -> bool,
) -> Vec<SseEvent> {
    let mut body = resp.bytes_stream();
    // Bytes until a whole event is in: a character may be split between two reads.
    let mut buf: Vec<u8> = Vec::new();
    let mut events = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.unwrap());
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buf.drain(..end + 2).collect();
            let block = String::from_utf8(block).expect("an SSE event is UTF-8");
            let mut event = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if event.is_empty() {
                continue; // a keep-alive comment
            }
            let e = SseEvent {
                event,
                data: serde_json::from_str(&data).unwrap(),
                at: started.elapsed(),
            };
            let done = stop(&e);
            events.push(e);
            if done {
                return events;
            }
        }
    }
    events
}

pub async fn stream(s: &Server, path: &str, body: Value) -> Vec<SseEvent> {
    let started = Instant::now();
    let resp = s
        .client
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    read_events(resp, started, |_| false).await
}

fn kinds(events: &[SseEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

#[tokio::test]
async fn output_streams_before_the_run_ends_then_exactly_one_result() {
    let s = Server::start().await;
    let code = "import sys, time\nprint('first', flush=True)\nprint('oops', file=sys.stderr, flush=True)\ntime.sleep(1)\nprint('second')";
    let events = stream(&s, "/v1/execute/stream", json!({ "code": code })).await;
    let names = kinds(&events);
    assert_eq!(names.last(), Some(&"result"), "{events:?}");
    assert_eq!(names.iter().filter(|n| **n == "result").count(), 1);
    assert!(names[..names.len() - 1].iter().all(|n| *n == "output"));
    let first = &events[0];
    assert_eq!(first.data, json!({"stream": "stdout", "data": "first\n"}));
    assert!(
        events
            .iter()
            .any(|e| e.data == json!({"stream": "stderr", "data": "oops\n"}))
    );
    let result = events.last().unwrap();
    // The first line reached the client while the code was still sleeping.
    assert!(
        result.at >= first.at + Duration::from_millis(500),
        "first output at {:?}, result at {:?}",
        first.at,
        result.at
    );
    assert_eq!(result.data["exit_code"], 0);
    assert_eq!(result.data["timed_out"], false);
    assert_eq!(result.data["stdout"], "first\nsecond\n");
    assert!(result.data["duration_ms"].as_u64().unwrap() >= 1000);
    assert_eq!(result.data["files"], json!([]));
}

#[tokio::test]
async fn a_stream_that_times_out_ends_with_a_null_exit_code() {
    let s = Server::start().await;
    let events = stream(
        &s,
        "/v1/execute/stream",
        json!({ "code": "print('start', flush=True)\nwhile True: pass", "timeout_ms": 500 }),
    )
    .await;
    assert_eq!(kinds(&events), ["output", "result"]);
    let result = &events[1].data;
    assert_eq!(result["exit_code"], Value::Null);
    assert_eq!(result["timed_out"], true);
}

#[tokio::test]
async fn validation_errors_come_before_the_stream() {
    let s = Server::start().await;
    let (status, body) = s
        .post(
            "/v1/execute/stream",
            &json!({ "code": "1", "timeout_ms": 10_000_000 }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("timeout_ms"));
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_kills_its_worker() {
    let s = Server::start().await;
    let started = Instant::now();
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({ "code": "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(50)", "timeout_ms": 60000 }))
        .send()
        .await
        .unwrap();
    let events = read_events(resp, started, |e| e.event == "output").await;
    let pid: u32 = events[0].data["data"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(process_exists(pid));
    // `read_events` returned: the response (and its connection) are dropped here.
    let deadline = Instant::now() + Duration::from_secs(15);
    while process_exists(pid) {
        assert!(
            Instant::now() < deadline,
            "worker {pid} still runs after its client left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The pool recovers: the next request runs.
    assert_eq!(s.run("print('next')").await["stdout"], "next\n");
}

#[tokio::test]
async fn rich_results_are_bundles_in_the_order_produced() {
    let s = Server::start().await;
    let r = s
        .run("import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3, 19]})")
        .await;
    let bundles = r["results"].as_array().unwrap();
    assert_eq!(bundles.len(), 1, "{r}");
    let md = bundles[0]["text/markdown"].as_str().unwrap();
    assert!(
        md.contains("| city | temp |") && md.contains("| 0 | Oslo | 3 |"),
        "{md}"
    );
    assert!(bundles[0]["text/html"].as_str().unwrap().contains("<table"));
    assert!(bundles[0]["text/plain"].as_str().unwrap().contains("Oslo"));

    // A figure left open is captured without savefig.
    let r = s
        .run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nprint('ok')")
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let bundles = r["results"].as_array().unwrap();
    assert_eq!(bundles.len(), 1, "{r}");
    let png = bundles[0]["image/png"].as_str().unwrap();
    assert!(png.starts_with("iVBORw0KGgo"), "not a base64 PNG");

    let r = s.run("display('a')\ndisplay(2)\nx = 1").await;
    assert_eq!(
        r["results"],
        json!([{"text/plain": "'a'"}, {"text/plain": "2"}])
    );
    assert_eq!(r["stdout"], "'a'\n2\n");
}

#[tokio::test]
async fn an_oversized_bundle_is_replaced_by_a_note() {
    let s = Server::start_with(
        crate::harness::Options::default().env("SNAKECAGE_LIMITS__MAX_BUNDLE_BYTES", 4096),
    )
    .await;
    let r = s.run("'x' * 10000").await;
    let note = r["results"][0]["text/plain"].as_str().unwrap();
    assert!(note.starts_with("[output omitted"), "{note}");
    assert!(note.contains("4096 bytes"), "{note}");
}

/// Output past `limits.max_output_bytes` is cut where the result cuts it: a stream's
/// `output` events add up to the result's text, the truncation mark and the end of the
/// output included, so a client that shows only the events sees the cut and the end.
#[tokio::test]
async fn streamed_output_past_the_limit_ends_with_the_same_mark_as_the_result() {
    let s = Server::start_with(
        crate::harness::Options::default().env("SNAKECAGE_LIMITS__MAX_OUTPUT_BYTES", 4096),
    )
    .await;
    let code = "import sys\nfor i in range(40):\n    print('ü' * 300, flush=True)\n    \
                print('é', i, file=sys.stderr, flush=True)\nprint('END')";
    let events = stream(&s, "/v1/execute/stream", json!({ "code": code })).await;
    let result = &events.last().unwrap().data;
    assert_eq!(result["stdout_truncated"], true, "{result}");
    assert_eq!(result["stderr_truncated"], false, "{result}");
    for name in ["stdout", "stderr"] {
        let streamed: String = events
            .iter()
            .filter(|e| e.event == "output" && e.data["stream"] == name)
            .map(|e| e.data["data"].as_str().unwrap())
            .collect();
        assert_eq!(streamed, result[name].as_str().unwrap(), "{name}");
    }
    // Its head and, after the mark, its end.
    let stdout = result["stdout"].as_str().unwrap();
    assert!(
        stdout.ends_with(&format!("{}\nEND\n", "ü".repeat(300))),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches(" bytes truncated]...\n").count(),
        1,
        "{stdout}"
    );
    assert!(!stdout.contains('\u{fffd}'), "{stdout}");
}
