//! Ranged downloads (`Range`, `If-Range`) of `GET /v1/files/{id}`, the same on the local
//! store and on the S3 store (a real SeaweedFS): a single range is 206 with exactly its
//! bytes, one past the end 416 with the file's size, what cannot be honoured the whole
//! file, and another key's file 404 whatever the range.

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::Value;

use crate::auth::keys_add;
use crate::backing::Seaweed;
use crate::harness::{Options, Server, check_error_body};
use crate::s3_store::s3_options;

/// Deterministic bytes with no period a wrong offset could hide behind (xorshift64).
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A few hundred KB, an odd size so no range lines up with a power of two.
const SIZE: usize = 300_007;

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// One tenant's requests.
struct Tenant {
    base: String,
    client: reqwest::Client,
}

impl Tenant {
    fn new(base: &str, key: &str) -> Self {
        let mut headers = HeaderMap::new();
        let bearer = HeaderValue::from_str(&format!("Bearer {key}")).unwrap();
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap();
        Self {
            base: base.to_owned(),
            client,
        }
    }

    async fn upload(&self, name: &str, bytes: Vec<u8>) -> String {
        let part = reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned());
        let form = reqwest::multipart::Form::new().part("file", part);
        let resp = self
            .client
            .post(format!("{}/v1/files", self.base))
            .multipart(form)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        let body: Value = resp.json().await.unwrap();
        body["file_id"].as_str().unwrap().to_owned()
    }

    async fn send(&self, method: reqwest::Method, id: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = self
            .client
            .request(method, format!("{}/v1/files/{id}", self.base));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await.unwrap();
        Answer {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.bytes().await.unwrap().to_vec(),
        }
    }

    async fn get(&self, id: &str, headers: &[(&str, &str)]) -> Answer {
        self.send(reqwest::Method::GET, id, headers).await
    }
}

/// What every download of the file says: its validator, that ranges are taken, and how
/// many bytes follow.
fn assert_download_headers(answer: &Answer, etag: &str, length: usize) {
    assert_eq!(answer.header("etag"), Some(etag));
    assert_eq!(answer.header("accept-ranges"), Some("bytes"));
    assert_eq!(
        answer.header("content-length"),
        Some(length.to_string().as_str())
    );
}

/// The whole file, 200, as without a `Range`.
fn assert_whole(answer: &Answer, data: &[u8], etag: &str, why: &str) {
    assert_eq!(answer.status, 200, "{why}");
    assert_eq!(answer.header("content-range"), None, "{why}");
    assert_download_headers(answer, etag, data.len());
    assert!(answer.body == data, "{why}: {} bytes", answer.body.len());
}

async fn ranges_hold(alice: &Tenant, bob: &Tenant) {
    let data = noise(SIZE);
    let id = alice.upload("données brutes é.bin", data.clone()).await;
    let etag = format!("\"{id}\"");

    let whole = alice.get(&id, &[]).await;
    assert_whole(&whole, &data, &etag, "no Range");
    assert_eq!(
        whole.header("content-disposition"),
        Some(
            "attachment; filename=\"donn_es brutes _.bin\"; \
             filename*=UTF-8''donn%C3%A9es%20brutes%20%C3%A9.bin"
        )
    );
    let head = alice.send(reqwest::Method::HEAD, &id, &[]).await;
    assert_eq!(head.status, 200);
    assert_download_headers(&head, &etag, SIZE);
    // Ranges are defined for GET alone: a HEAD with one describes the whole file.
    let head = alice
        .send(reqwest::Method::HEAD, &id, &[("range", "bytes=0-9")])
        .await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-range"), None);
    assert_download_headers(&head, &etag, SIZE);

    let last = SIZE - 1;
    let whole_range = format!("bytes=0-{last}");
    let from_the_end = format!("bytes={}-", SIZE - 7);
    let past_the_end = format!("bytes={}-{}", SIZE - 7, SIZE * 3);
    for (range, first, end) in [
        ("bytes=0-999", 0, 1000),
        ("bytes=123457-200000", 123_457, 200_001),
        (from_the_end.as_str(), SIZE - 7, SIZE),
        (past_the_end.as_str(), SIZE - 7, SIZE),
        ("bytes=-500", SIZE - 500, SIZE),
        ("bytes=-999999", 0, SIZE),
        ("bytes=250000-", 250_000, SIZE),
        ("bytes=77-77", 77, 78),
        (whole_range.as_str(), 0, SIZE),
    ] {
        let part = alice.get(&id, &[("range", range)]).await;
        assert_eq!(part.status, 206, "{range}");
        let content_range = format!("bytes {first}-{}/{SIZE}", end - 1);
        assert_eq!(
            part.header("content-range"),
            Some(content_range.as_str()),
            "{range}"
        );
        assert_download_headers(&part, &etag, end - first);
        assert!(
            part.body == data[first..end],
            "{range}: {} bytes, not bytes {first}..{end}",
            part.body.len()
        );
    }

    // A range that starts at the end: 416, with the size in `Content-Range` and `detail`.
    for range in [
        format!("bytes={SIZE}-"),
        format!("bytes={SIZE}-{}", SIZE + 10),
    ] {
        let refused = alice.get(&id, &[("range", &range)]).await;
        assert_eq!(refused.status, 416, "{range}");
        let body = refused.json();
        assert_eq!(check_error_body(416, &body), "range_not_satisfiable");
        let star = format!("bytes */{SIZE}");
        assert_eq!(refused.header("content-range"), Some(star.as_str()));
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("{SIZE} bytes long")), "{detail}");
    }

    // Several ranges, or a header that is not a byte range: the whole file (RFC 9110
    // §14.2 lets a server ignore Range).
    for range in [
        "bytes=0-9,100-109",
        "bytes=0-9, 400000-",
        "bytes=abc",
        "bytes=9-0",
        "lines=1-2",
    ] {
        assert_whole(
            &alice.get(&id, &[("range", range)]).await,
            &data,
            &etag,
            range,
        );
    }

    // If-Range: the range when it names this file's bytes, the whole file otherwise.
    let resumed = alice
        .get(&id, &[("range", "bytes=1000-"), ("if-range", &etag)])
        .await;
    assert_eq!(resumed.status, 206);
    assert!(resumed.body == data[1000..]);
    let weak = format!("W/{etag}");
    for validator in [
        "\"0190c0de-0000-7000-8000-000000000000\"",
        weak.as_str(),
        "Wed, 21 Oct 2026 07:28:00 GMT",
    ] {
        let stale = alice
            .get(&id, &[("range", "bytes=1000-"), ("if-range", validator)])
            .await;
        assert_whole(&stale, &data, &etag, validator);
    }

    // Another key's file is not found, as without a range: no range, not even one past
    // the end (whose 416 would tell the size), says it exists.
    let without = bob.get(&id, &[]).await;
    assert_eq!(without.status, 404);
    assert_eq!(check_error_body(404, &without.json()), "file_not_found");
    for range in ["bytes=0-9".to_owned(), format!("bytes={SIZE}-")] {
        let with = bob.get(&id, &[("range", &range)]).await;
        assert_eq!(with.status, 404, "{range}");
        assert_eq!(with.json(), without.json(), "{range}");
        assert_eq!(with.header("content-range"), None, "{range}");
    }
}

/// Two tenants on a server started with `options` and their keys.
async fn two_tenants(options: Options) -> (Server, Tenant, Tenant, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let alice = keys_add(&keys, "alice", &[]);
    let bob = keys_add(&keys, "bob", &[]);
    let server = Server::start_with(options.env("SNAKECAGE_AUTH__KEYS_FILE", keys.display())).await;
    let (alice, bob) = (
        Tenant::new(&server.base, &alice),
        Tenant::new(&server.base, &bob),
    );
    (server, alice, bob, dir)
}

#[tokio::test]
async fn ranged_downloads_from_the_local_store() {
    let (_server, alice, bob, _dir) = two_tenants(Options::default()).await;
    ranges_hold(&alice, &bob).await;
}

#[tokio::test]
async fn ranged_downloads_from_the_s3_store() {
    let weed = Seaweed::start().await;
    let (_server, alice, bob, _dir) = two_tenants(s3_options(&weed, "ranges")).await;
    ranges_hold(&alice, &bob).await;
}
