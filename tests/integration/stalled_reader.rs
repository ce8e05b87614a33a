//! A streaming client that keeps its connection open but stops reading: its run still ends
//! at its deadline or its cancel, its slot is free for others at once (a session's lock
//! too, the session kept), and the stream it reads later is whole, in order, and ends
//! with the result.

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::harness::{Options, Server};
use crate::reliability::eventually;

/// Redraws a progress bar every millisecond, each redraw flushed, for as long as it is
/// let: a megabyte of output a second, more than twice that in events (a terminal escape
/// is six bytes in an event's JSON), so that a client that stops reading leaves more of
/// it than every buffer between the run and the client holds within a few seconds.
const PROGRESS: &str = "import sys, time\ni = 0\nwhile True:\n    i += 1\n    sys.stdout.write('\\x1b[2K\\r' * 200 + str(i))\n    sys.stdout.flush()\n    time.sleep(0.001)";

/// Long enough for [`PROGRESS`] to outgrow those buffers before its deadline.
const TIMEOUT_MS: u64 = 8000;

/// A server with one slot, whose output limit is far above what the sockets and any
/// fixed buffer between a run and its client hold.
async fn server() -> Server {
    let options = Options::default()
        .env("SNAKECAGE_POOL__SIZE", 1)
        .env("SNAKECAGE_LIMITS__MAX_OUTPUT_BYTES", 8 << 20);
    Server::start_with(options).await
}

/// A client of `path` that sends its request and reads nothing, its receive buffer as
/// small as the kernel allows.
async fn stalled_client(s: &Server, path: &str, body: &Value) -> TcpStream {
    let addr = s.base.trim_start_matches("http://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// Reads the rest of the response to its end: its head and its SSE events.
async fn read_to_end(mut stream: TcpStream) -> (String, Vec<(String, Value)>) {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let body = dechunk(&raw[split + 4..]);
    let text = String::from_utf8(body).expect("SSE is UTF-8");
    let events = text
        .split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            Some((event?, serde_json::from_str(&data).unwrap()))
        })
        .collect();
    (head, events)
}

/// The body of a `Transfer-Encoding: chunked` message, which must end well.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = std::str::from_utf8(&raw[..line_end]).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&raw[..size]);
        assert_eq!(&raw[size..size + 2], b"\r\n");
        raw = &raw[size + 2..];
    }
}

/// The stdout the `output` events carried, and the `result` the stream ended with.
fn streamed_stdout_and_result(events: &[(String, Value)]) -> (String, &Value) {
    let (last, result) = events.last().expect("the stream has events");
    assert_eq!(last, "result", "the stream ends with its result: {result}");
    let stdout = events
        .iter()
        .filter(|(event, data)| event == "output" && data["stream"] == "stdout")
        .map(|(_, data)| data["data"].as_str().unwrap())
        .collect();
    (stdout, result)
}

/// The run's whole output reached the client, in order: the result's text.
fn assert_whole(events: &[(String, Value)]) -> &Value {
    let (stdout, result) = streamed_stdout_and_result(events);
    assert!(!stdout.is_empty(), "{result}");
    assert!(
        stdout == result["stdout"].as_str().unwrap(),
        "the streamed stdout ({} bytes) is not the result's ({} bytes)",
        stdout.len(),
        result["stdout"].as_str().unwrap().len()
    );
    result
}

#[tokio::test]
async fn a_stream_client_that_stops_reading_does_not_hold_its_run_past_its_deadline() {
    let s = server().await;
    let body = json!({ "code": PROGRESS, "timeout_ms": TIMEOUT_MS });
    let stalled = stalled_client(&s, "/v1/execute/stream", &body).await;
    eventually(60, "the stalled run started", async || {
        s.health().await["pool"]["busy"] == 1
    })
    .await;
    // Its client still reads nothing: the run ended at its deadline all the same, and the
    // only slot is free for another request.
    eventually(60, "the stalled run ended at its deadline", async || {
        s.health().await["pool"]["busy"] == 0
    })
    .await;
    assert_eq!(s.run("print('next')").await["stdout"], "next\n");

    let (_, events) = read_to_end(stalled).await;
    let result = assert_whole(&events);
    assert_eq!(result["verdict"], "timeout", "{result}");
    s.stop();
}

#[tokio::test]
async fn a_stalled_stream_is_cancelled_by_delete_at_once() {
    let s = server().await;
    let body = json!({ "code": PROGRESS, "timeout_ms": 60_000 });
    let mut stalled = stalled_client(&s, "/v1/execute/stream", &body).await;
    // The head arrives before the events: it names the run.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stalled.read_u8().await.unwrap());
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let run_id = head
        .lines()
        .find_map(|line| line.strip_prefix("x-run-id:"))
        .unwrap_or_else(|| panic!("no x-run-id in {head}"))
        .trim()
        .to_owned();
    eventually(60, "the stalled run started", async || {
        s.health().await["pool"]["busy"] == 1
    })
    .await;
    // Not a bound on anything: the time its output takes to fill the buffers, so that the
    // cancel comes to a run whose client holds it up.
    tokio::time::sleep(std::time::Duration::from_millis(TIMEOUT_MS)).await;
    let cancelled = s
        .client
        .delete(format!("{}/v1/runs/{run_id}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 204);
    // Long before its deadline, its client still reading nothing.
    eventually(30, "the cancelled run left its slot", async || {
        s.health().await["pool"]["busy"] == 0
    })
    .await;
    assert_eq!(s.run("print('next')").await["stdout"], "next\n");

    let mut rest = Vec::new();
    stalled.read_to_end(&mut rest).await.unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.contains("event: result"),
        "the stream ends with its result"
    );
    assert!(text.contains(r#""verdict":"killed""#), "{}", tail(&text));
    s.stop();
}

#[tokio::test]
async fn a_stalled_session_stream_ends_at_its_deadline_and_keeps_the_session() {
    let s = server().await;
    let id = s.new_session().await;
    s.session_run(&id, "kept = 41").await;
    let body = json!({ "code": PROGRESS, "timeout_ms": TIMEOUT_MS });
    let stalled = stalled_client(&s, &format!("/v1/sessions/{id}/execute/stream"), &body).await;
    eventually(60, "the stalled session run started", async || {
        s.health().await["pool"]["busy"] == 1
    })
    .await;
    // Interrupted at its deadline as if its client read: the session is free for its next
    // run (no 409), its state kept.
    let mut next = Value::Null;
    eventually(60, "the session took its next run", async || {
        let (status, body) = s
            .post(
                &format!("/v1/sessions/{id}/execute"),
                &json!({ "code": "print(kept + 1)" }),
            )
            .await;
        assert!(status == 200 || status == 409, "{status} {body}");
        next = body;
        status == 200
    })
    .await;
    assert_eq!(next["stdout"], "42\n", "{next}");

    let (_, events) = read_to_end(stalled).await;
    let result = assert_whole(&events);
    assert_eq!(result["timed_out"], true, "{result}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .contains("KeyboardInterrupt"),
        "{result}"
    );
    assert_eq!(s.session_run(&id, "print(kept)").await["stdout"], "41\n");
    s.stop();
}

/// The end of a long text, for a message.
fn tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(2000);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
