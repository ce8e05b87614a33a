//! A request refused before its body was read keeps the client's connection usable: the
//! rest of a body of known, moderate length is drained and the next request on the same
//! connection is answered; otherwise the refusal says `connection: close`. Found by a
//! stranger: after a 413, Python's `http.client` failed its next request with
//! `BrokenPipeError`, the connection closed without a word.

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
