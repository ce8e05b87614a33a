//! The S3 file store against a real S3-compatible server (SeaweedFS): what the local store
//! promises holds (streaming, limits, quota, run outputs, tenant-free round trips with
//! awkward names, survival across a restart), and an unreachable store is a clear 503,
//! never a 500, with `/health` saying so while `/ready` stays 200 (every replica shares
//! the store: its outage must not take them all out of the load balancer).

use serde_json::{Value, json};

use crate::backing::Seaweed;
use crate::harness::{Options, Server};

pub fn s3_options(weed: &Seaweed, prefix: &str) -> Options {
    let mut options = Options::default();
    for (k, v) in weed.env(prefix) {
        options = options.env(&k, v);
    }
    options
}

pub async fn upload(base: &str, name: &str, bytes: Vec<u8>) -> (u16, Value) {
    let part = reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned());
    let form = reqwest::multipart::Form::new().part("file", part);
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/files"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

pub async fn download(base: &str, id: &str) -> (u16, Vec<u8>) {
    let resp = reqwest::get(format!("{base}/v1/files/{id}")).await.unwrap();
    (resp.status().as_u16(), resp.bytes().await.unwrap().to_vec())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn the_s3_store_keeps_every_promise_of_the_local_one() {
    let mut weed = Seaweed::start().await;
    let options = s3_options(&weed, "promises")
        .env("SNAKECAGE_FILES__MAX_FILE_SIZE_MB", 10)
        .env("SNAKECAGE_FILES__QUOTA_MB", 24)
        .env("SNAKECAGE_S3__USAGE_CACHE_MS", 0);
    let s = Server::start_with(options).await;
    let base = s.base.clone();

    // A 9 MiB file goes up as a multipart upload and comes back byte for byte.
    let big = pattern(9 << 20, 7);
    let (status, up) = upload(&base, "données é #1.bin", big.clone()).await;
    assert_eq!(status, 201, "{up}");
    let big_id = up["file_id"].as_str().unwrap().to_owned();
    let resp = reqwest::get(format!("{base}/v1/files/{big_id}"))
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["content-disposition"],
        "attachment; filename=\"donn_es _ #1.bin\"; filename*=UTF-8''donn%C3%A9es%20%C3%A9%20#1.bin"
    );
    assert!(resp.bytes().await.unwrap() == big);

    // Past the maximum size: 413, and nothing is kept.
    let (status, body) = upload(&base, "huge.bin", pattern((10 << 20) + 1, 1)).await;
    assert_eq!(status, 413, "{body}");

    // A run reads the staged file and writes one; the output is stored in S3.
    let code = "data = open('in/d.bin', 'rb').read()\n\
                open('out.bin', 'wb').write(data[:1500000][::-1])\n\
                print(len(data))";
    let (status, r) = s
        .post(
            "/v1/execute",
            &json!({"code": code, "files": [{"path": "in/d.bin", "file_id": big_id}]}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], format!("{}\n", 9 << 20), "{r}");
    let out = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "out.bin")
        .unwrap_or_else(|| panic!("{r}"));
    let out_id = out["file_id"].as_str().unwrap().to_owned();
    let mut expected = big[..1_500_000].to_vec();
    expected.reverse();
    assert!(download(&base, &out_id).await == (200, expected.clone()));

    // Quota: 9 MiB + 1.4 MiB + 9 MiB fit in 24 MiB, the next 9 MiB does not (507).
    let (status, second) = upload(&base, "b.bin", pattern(9 << 20, 3)).await;
    assert_eq!(status, 201, "{second}");
    let (status, full) = upload(&base, "c.bin", pattern(9 << 20, 4)).await;
    assert_eq!(status, 507, "{full}");
    assert!(full["detail"].as_str().unwrap().contains("quota"), "{full}");
    let names: Vec<Value> = list_names(&base).await;
    assert_eq!(
        names,
        vec![json!("données é #1.bin"), json!("out.bin"), json!("b.bin")]
    );

    // Delete frees the space.
    let second_id = second["file_id"].as_str().unwrap();
    let del = reqwest::Client::new()
        .delete(format!("{base}/v1/files/{second_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 204);
    assert_eq!(download(&base, second_id).await.0, 404);
    let (status, third) = upload(&base, "c.bin", pattern(9 << 20, 4)).await;
    assert_eq!(status, 201, "{third}");

    // A restarted service (no local state at all) serves the same files.
    drop(s);
    let s = Server::start_with(s3_options(&weed, "promises")).await;
    assert!(download(&s.base, &out_id).await == (200, expected));
    assert_eq!(list_names(&s.base).await.len(), 3);
    assert_eq!(s.get("/ready").await.0, 200);
    let health = store_checked(&s).await;
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(
        health["file_store"],
        json!({"backend": "s3", "state": "ok"}),
        "{health}"
    );

    // A bucket that does not exist: ready (code runs), /health degraded saying why.
    let mut missing = s3_options(&weed, "promises");
    missing = missing.env("SNAKECAGE_S3__BUCKET", "no-such-bucket");
    let m = Server::start_with(missing).await;
    let health = store_checked(&m).await;
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["file_store"]["state"], "unavailable", "{health}");
    let detail = health["file_store"]["detail"].as_str().unwrap();
    assert!(detail.contains("NoSuchBucket"), "{health}");
    let (status, _, ready) = m.get("/ready").await;
    assert_eq!(status, 200, "{ready}");
    let (status, _, body) = m.get("/v1/files").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("NoSuchBucket"), "{body}");
    drop(m);

    // The store goes away: file requests get 503 with the store's error, /health says so,
    // /ready stays 200 and code that needs no file still runs.
    weed.kill();
    let (status, body) = upload(&s.base, "x.txt", b"x".to_vec()).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("file store is unavailable"),
        "{body}"
    );
    let (status, _, body) = s.get("/v1/files").await;
    assert_eq!(status, 503, "{body}");
    let (status, _) = download(&s.base, &out_id).await;
    assert_eq!(status, 503);
    let (status, _, ready) = s.get("/ready").await;
    assert_eq!(status, 200, "{ready}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let health = loop {
        // The background check notices within its interval.
        let health = s.health().await;
        if health["file_store"]["state"] == "unavailable" {
            break health;
        }
        assert_eq!(health["file_store"]["state"], "ok", "{health}");
        assert!(
            std::time::Instant::now() < deadline,
            "never noticed: {health}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["ready"], true, "{health}");
    let detail = health["file_store"]["detail"].as_str().unwrap();
    assert!(detail.contains("file store is unavailable"), "{health}");
    let (status, r) = s.post("/v1/execute", &json!({"code": "print(6*7)"})).await;
    assert_eq!((status, r["stdout"].as_str()), (200, Some("42\n")), "{r}");
    let (_, _, metrics) = s.get("/metrics").await;
    let errors = metrics
        .lines()
        .find(|l| l.starts_with("snakecage_file_store_errors_total{operation=\"put\"}"))
        .unwrap();
    assert!(!errors.ends_with(" 0"), "{errors}");
    assert!(
        metrics
            .lines()
            .any(|l| l == "snakecage_file_store_available 0"),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l == "snakecage_ready 1"),
        "{metrics}"
    );
}

/// `/health` once the file store's first background check has run.
async fn store_checked(s: &Server) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let health = s.health().await;
        if health["file_store"]["state"] != "unchecked" {
            return health;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never checked: {health}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn list_names(base: &str) -> Vec<Value> {
    let body: Value = reqwest::get(format!("{base}/v1/files"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["files"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|f| f["filename"].clone())
        .collect()
}

/// A plain-HTTP endpoint without `s3.allow_http` would start and then fail every file
/// request; start-up refuses it instead, naming the key to set and the endpoint, whether
/// the endpoint is `s3.endpoint` or comes from the AWS environment.
#[test]
fn a_plain_http_endpoint_without_allow_http_fails_start_up() {
    for endpoint_var in ["SNAKECAGE_S3__ENDPOINT", "AWS_ENDPOINT_URL"] {
        let said = start_up_error(&[
            ("SNAKECAGE_FILES__BACKEND", "s3"),
            ("SNAKECAGE_S3__BUCKET", "fichiers-été"),
            (endpoint_var, "http://minio.storage:9000"),
        ]);
        assert!(
            said.contains("s3.allow_http") && said.contains("http://minio.storage:9000"),
            "{endpoint_var}: {said}"
        );
    }
}

/// What the service wrote to stderr on failing to start with `env`.
fn start_up_error(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(crate::harness::repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", dir.path())
        .env("SNAKECAGE_POOL__SIZE", "1")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A service that starts anyway would never exit: stop waiting for it, generously.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "it started: {said}");
    said
}

/// The log lines (JSON) of `s` whose message is `message`.
fn logged(s: &Server, message: &str) -> usize {
    s.log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["fields"]["message"] == message)
        .count()
}

/// While the store is down, every scrape of `/metrics` (and every refresh of the status
/// page, which reads the same gauges) fails to list it: that is logged once when it starts
/// failing and once, as info, when it works again, not on every scrape.
#[tokio::test]
async fn a_store_outage_is_logged_once_however_often_the_metrics_are_scraped() {
    const FAILED: &str = "listing the file store for the metrics failed";
    const WORKS: &str = "listing the file store for the metrics works again";
    let mut weed = Seaweed::start().await;
    let s = Server::start_with(s3_options(&weed, "scrapes")).await;
    let (status, up) = upload(&s.base, "été.txt", b"x".to_vec()).await;
    assert_eq!(status, 201, "{up}");
    let scrape = async || {
        let (status, _, metrics) = s.get("/metrics").await;
        assert_eq!(status, 200);
        metrics
    };
    assert!(scrape().await.contains("snakecage_files_stored 1"));

    weed.kill();
    for _ in 0..5 {
        scrape().await;
        let (status, _) = s.get_json("/v1/status").await;
        assert_eq!(status, 200);
    }
    assert_eq!(logged(&s, FAILED), 1, "{}", s.log());
    assert_eq!(logged(&s, WORKS), 0, "{}", s.log());

    weed.restart().await;
    for _ in 0..3 {
        assert!(scrape().await.contains("snakecage_files_stored 1"));
    }
    assert_eq!(logged(&s, FAILED), 1, "{}", s.log());
    assert_eq!(logged(&s, WORKS), 1, "{}", s.log());
}

/// Two `file` parts in one upload: the first, streamed to S3, is never completed, so it
/// is in no listing and no quota while the body comes, nor after the 400. (An upload in
/// progress shows nowhere in the bucket, so the listing is only watched.)
#[tokio::test]
async fn a_second_file_part_refuses_an_upload_before_the_first_is_visible() {
    let weed = Seaweed::start().await;
    let options = s3_options(&weed, "two-parts")
        .env("SNAKECAGE_FILES__QUOTA_MB", 1)
        .env("SNAKECAGE_S3__USAGE_CACHE_MS", 0);
    let s = Server::start_with(options).await;
    crate::upload_names::a_second_file_part_refuses_the_upload_unseen(&s, async || {}).await;
}
