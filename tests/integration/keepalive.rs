//! A request refused before its body was read keeps the client's connection usable: the
//! rest of a body of known, moderate length is drained and the next request on the same
//! connection is answered; otherwise the refusal says `connection: close`. Found by a
//! stranger: after a 413, Python's `http.client` failed its next request with
//! `BrokenPipeError`, the connection closed without a word. Over HTTP/2 a refusal resets its
//! own stream only.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::harness::Server;

/// One response read off `conn`: its status, its lower-cased headers and its body.
async fn read_response(conn: &mut OwnedReadHalf) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let mut chunk = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(60), conn.read(&mut chunk))
            .await
            .expect("an answer in time")
            .expect("reading the answer");
        assert!(n > 0, "the connection closed before an answer");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    let len: usize = header(&headers, "content-length")
        .expect("a content-length")
        .parse()
        .unwrap();
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let mut chunk = vec![0u8; len - body.len()];
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed inside the body");
        body.extend_from_slice(&chunk[..n]);
    }
    (status, headers, body)
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A connection to `s`, as its two halves.
async fn connect(s: &Server) -> (OwnedReadHalf, OwnedWriteHalf) {
    TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap()
        .into_split()
}

/// Sends `head` then `body` while the answer is read (the server may answer before it
/// has read the body, or never read all of it), and returns the answer and the write half.
async fn exchange(
    read: &mut OwnedReadHalf,
    mut write: OwnedWriteHalf,
    head: String,
    body: Vec<u8>,
) -> ((u16, Vec<(String, String)>, Vec<u8>), OwnedWriteHalf) {
    let sender = tokio::spawn(async move {
        write.write_all(head.as_bytes()).await.unwrap();
        // What the server did not read is its own business: a failed write is not ours.
        let _ = write.write_all(&body).await;
        write
    });
    let answer = read_response(read).await;
    (answer, sender.await.unwrap())
}

fn post(path: &str, content_type: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\ncontent-length: {len}\r\n\r\n"
    )
}

const HEALTH: &str = "GET /health HTTP/1.1\r\nhost: x\r\n\r\n";

#[tokio::test]
async fn a_request_refused_before_its_body_was_read_leaves_the_connection_usable() {
    let s = Server::start().await;
    // Over max_request_bytes (10 MiB), a route with a wrong media type, an unknown route:
    // each refused with its body unread, each connection then serves /health.
    let over = format!("{{\"code\": \"# {}\"}}", "é".repeat(11 << 19));
    let cases = [
        ("/v1/execute", "application/json", over.into_bytes(), 413),
        ("/v1/execute", "text/plain", vec![b'x'; 1 << 20], 415),
        (
            "/v1/nowhere/ünïcode",
            "application/json",
            vec![b'{'; 1 << 20],
            404,
        ),
    ];
    for (path, content_type, body, expected) in cases {
        let (mut read, write) = connect(&s).await;
        let head = post(path, content_type, body.len());
        let ((status, headers, text), write) = exchange(&mut read, write, head, body).await;
        assert_eq!(
            status,
            expected,
            "{path}: {}",
            String::from_utf8_lossy(&text)
        );
        assert_eq!(header(&headers, "connection"), None, "{path}: {headers:?}");
        let ((status, _, text), _) = exchange(&mut read, write, HEALTH.into(), Vec::new()).await;
        assert_eq!(
            status,
            200,
            "after {path}: {}",
            String::from_utf8_lossy(&text)
        );
    }
}

#[tokio::test]
async fn a_refusal_that_leaves_too_much_unread_says_connection_close() {
    let s = Server::start().await;
    // 200 MiB promised (and sent): more than is drained, so the refusal closes, and says so.
    let (mut read, write) = connect(&s).await;
    let head = post("/v1/execute", "application/json", 200 << 20);
    let ((status, headers, _), _) = exchange(&mut read, write, head, vec![b' '; 200 << 20]).await;
    assert_eq!(status, 413);
    assert_eq!(header(&headers, "connection"), Some("close"), "{headers:?}");
    // A chunked body (its length unknown) refused unread: the same.
    let (mut read, write) = connect(&s).await;
    let head = "POST /v1/nowhere HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_owned();
    let ((status, headers, _), _) = exchange(&mut read, write, head, Vec::new()).await;
    assert_eq!(status, 404);
    assert_eq!(header(&headers, "connection"), Some("close"), "{headers:?}");
}

/// A body whose `Content-Length` is over its route's limit is refused as soon as the
/// headers are read, with the route's own JSON detail: the client that has sent only the
/// headers (and would send the rest slowly) reads the 413 without sending a byte of the
/// body. Before, the service waited for the first `max_request_bytes` of it. Past what is
/// drained, the refusal closes the connection and says so.
#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_before_any_of_it_is_sent() {
    let s = Server::start().await;
    let json = "application/json";
    let cases = [
        (
            "/v1/execute",
            json,
            "over 10485760 bytes (limits.max_request_bytes)",
        ),
        (
            "/v1/sessions",
            json,
            "over 10485760 bytes (limits.max_request_bytes)",
        ),
        // Not a JSON body, but read whole all the same.
        (
            "/v1/admin/packages/sync",
            "text/plain",
            "limits.max_request_bytes",
        ),
        (
            "/v1/runs/run_x/tool_calls/call_y",
            json,
            "larger than a tool's result may be (tools.max_result_bytes",
        ),
    ];
    for (path, content_type, detail) in cases {
        let (mut read, mut write) = connect(&s).await;
        let head = post(path, content_type, 200 << 20);
        write.write_all(head.as_bytes()).await.unwrap();
        // The write half stays open: the body is still owed, not cut short.
        let (status, headers, body) = read_response(&mut read).await;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 413, "{path}: {body}");
        assert_eq!(body["code"], "payload_too_large", "{path}: {body}");
        assert!(
            body["detail"].as_str().unwrap().contains(detail),
            "{path}: {body}"
        );
        assert_eq!(header(&headers, "connection"), Some("close"), "{path}");
        drop(write);
    }

    // Over the limit but within what is drained (20 MiB): refused at once as well, and a
    // client that then sends what it declared keeps its connection.
    for (path, detail) in [
        (
            "/v1/execute",
            "over 10485760 bytes (limits.max_request_bytes)",
        ),
        ("/mcp", "over 10485760 bytes (limits.max_request_bytes)"),
    ] {
        let (mut read, mut write) = connect(&s).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\ncontent-length: {}\r\n\r\n",
            20 << 20
        );
        write.write_all(head.as_bytes()).await.unwrap();
        let (status, headers, body) = read_response(&mut read).await;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 413, "{path}: {body}");
        assert!(
            body["detail"].as_str().unwrap().contains(detail),
            "{path}: {body}"
        );
        assert_eq!(header(&headers, "connection"), None, "{path}: {headers:?}");
        write.write_all(&vec![b' '; 20 << 20]).await.unwrap();
        let ((status, _, _), _) = exchange(&mut read, write, HEALTH.into(), Vec::new()).await;
        assert_eq!(status, 200, "after {path}");
    }

    // Of unknown length (chunked): read up to the limit, then refused as it passes it, in
    // the same words.
    let (mut read, write) = connect(&s).await;
    let head = "POST /v1/execute HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                transfer-encoding: chunked\r\n\r\n"
        .to_owned();
    let size = 11 << 20;
    let mut chunk = format!("{size:x}\r\n").into_bytes();
    chunk.resize(chunk.len() + size, b' ');
    chunk.extend_from_slice(b"\r\n0\r\n\r\n");
    let ((status, _, body), _) = exchange(&mut read, write, head, chunk).await;
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 413, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("over 10485760 bytes (limits.max_request_bytes)"),
        "{body}"
    );
}

/// A request's body over HTTP/2, as these tests send it.
type H2Body = http_body_util::combinators::BoxBody<hyper::body::Bytes, std::convert::Infallible>;

/// The answer to `request` on `sender`'s connection: its status, headers and body.
async fn h2_exchange(
    sender: &mut hyper::client::conn::http2::SendRequest<H2Body>,
    request: hyper::Request<H2Body>,
) -> (u16, hyper::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    sender.ready().await.expect("the connection serves");
    let response = tokio::time::timeout(Duration::from_secs(60), sender.send_request(request))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body.to_vec())
}

/// Over HTTP/2 (h2c, prior knowledge) a body refused unread resets its own stream, not the
/// connection: the answer says nothing of closing (a `Connection` header is malformed in
/// HTTP/2), and the same connection serves the next request.
#[tokio::test]
async fn over_http2_a_refused_body_leaves_the_connection_serving() {
    use futures_util::StreamExt;
    use http_body_util::{BodyExt, Empty, StreamBody};
    use hyper::body::{Bytes, Frame};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let s = Server::start().await;
    let tcp = TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);

    // 200 MiB promised, a few bytes sent, the rest never: refused by its length at once.
    // Over HTTP/1 this refusal would close the connection.
    let start = futures_util::stream::once(async { Ok(Frame::data(Bytes::from("{\"code\": \""))) });
    let body = StreamBody::new(start.chain(futures_util::stream::pending()));
    let request = hyper::Request::post(format!("{}/v1/execute", s.base))
        .header("content-type", "application/json")
        .header("content-length", 200 << 20)
        .body(BodyExt::boxed(body))
        .unwrap();
    let (status, headers, body) = h2_exchange(&mut sender, request).await;
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 413, "{body}");
    assert_eq!(headers.get("connection"), None, "{headers:?}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("limits.max_request_bytes"),
        "{body}"
    );

    // The same connection, the next request.
    let request = hyper::Request::get(format!("{}/health", s.base))
        .body(BodyExt::boxed(Empty::new()))
        .unwrap();
    let (status, _, body) = h2_exchange(&mut sender, request).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(!connection.is_finished(), "the connection was closed");
}

/// Whether `conn` is closed by the server within `within` (reads to its end; what comes
/// before, an answer, is returned).
async fn closed_within(conn: &mut OwnedReadHalf, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(got)
}

/// Clients that hold connections without finishing a request (a slowloris): one that
/// sends nothing, one that stops inside its headers, one that stops inside its body, and
/// one kept alive and idle after an answer. Each is closed once `limits.client_timeout_ms`
/// has passed (the stalled body's request answered 400, saying why), while a client that
/// goes on is served throughout. Before, all of them were held for good.
#[tokio::test]
async fn connections_that_stall_are_closed_after_the_client_timeout() {
    let s = Server::start_with(
        crate::harness::Options::default().env("SNAKECAGE_LIMITS__CLIENT_TIMEOUT_MS", 1000),
    )
    .await;
    let (mut silent, _silent) = connect(&s).await;
    let (mut headers, mut headers_w) = connect(&s).await;
    headers_w
        .write_all(b"POST /v1/execute HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let (mut body, mut body_w) = connect(&s).await;
    let code = r#"{"code": "print('été')"}"#;
    body_w
        .write_all(post("/v1/execute", "application/json", code.len()).as_bytes())
        .await
        .unwrap();
    body_w.write_all(&code.as_bytes()[..8]).await.unwrap();
    let (mut idle, idle_w) = connect(&s).await;
    let ((status, _, _), _idle_w) = exchange(&mut idle, idle_w, HEALTH.into(), Vec::new()).await;
    assert_eq!(status, 200);

    // Another client is served meanwhile, on one connection kept alive.
    let (mut busy, mut busy_w) = connect(&s).await;
    for _ in 0..3 {
        busy_w.write_all(HEALTH.as_bytes()).await.unwrap();
        assert_eq!(read_response(&mut busy).await.0, 200);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }

    let within = Duration::from_secs(30);
    assert_eq!(closed_within(&mut silent, within).await, Some(Vec::new()));
    assert_eq!(closed_within(&mut headers, within).await, Some(Vec::new()));
    assert_eq!(closed_within(&mut idle, within).await, Some(Vec::new()));
    let answer = closed_within(&mut body, within).await.expect("closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(
        answer.contains(
            "the request body stalled: nothing of it arrived for 1000 ms (limits.client_timeout_ms)"
        ),
        "{answer}"
    );
}
