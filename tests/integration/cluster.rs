//! Three replicas with the S3 file store (SeaweedFS) and distinct replica ids behind
//! HAProxy (round-robin, health checks on `/ready`): files are shared, sessions are found
//! wherever a call lands (streaming included), a run's tool calls are answered and the
//! run cancelled through any replica, and a replica killed with SIGKILL costs
//! only its sessions (410), never a stored file or a stateless request.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::backing::{Haproxy, Seaweed, free_port};
use crate::harness::Server;
use crate::s3_store::{download, s3_options, upload};
use crate::stream::read_events;
use crate::streamed::Events;

const IDS: [&str; 3] = ["r0", "r1", "r2"];

async fn post(base: &str, path: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, body)
}

/// A counter of `/metrics` on `base`, by its full series name.
async fn series(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

const STATELESS_OK: &str = "snakecage_executions_total{kind=\"stateless\",outcome=\"ok\"}";
const FORWARDED: &str = "snakecage_session_forwards_total{outcome=\"answered\"}";

#[tokio::test]
#[ignore = "a cluster on loopback (SeaweedFS, three replicas, HAProxy); run alone with --ignored --test-threads=1"]
async fn three_replicas_behind_haproxy_share_files_and_find_their_sessions() {
    let weed = Seaweed::start().await;
    let ports: Vec<u16> = IDS.iter().map(|_| free_port()).collect();
    let start = |i: usize| {
        let mut options = s3_options(&weed, "cluster")
            .listen(&format!("127.0.0.1:{}", ports[i]))
            .env("SNAKECAGE_CLUSTER__REPLICA_ID", IDS[i]);
        for (id, port) in IDS.iter().zip(&ports) {
            let key = format!("SNAKECAGE_CLUSTER__PEERS__{id}");
            options = options.env(&key, format!("http://127.0.0.1:{port}"));
        }
        Server::start_with(options)
    };
    let (r0, r1, r2) = tokio::join!(start(0), start(1), start(2));
    let mut replicas = [Some(r0), Some(r1), Some(r2)];
    let bases: Vec<String> = replicas
        .iter()
        .map(|r| r.as_ref().unwrap().base.clone())
        .collect();
    let backends: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let lb = Haproxy::start(&backends);
    lb.wait_ready().await;

    // A file uploaded through one replica is staged by every replica.
    let data = "x\n1\n2\n3\n";
    let (status, up) = upload(&lb.base, "nombres é.csv", data.as_bytes().to_vec()).await;
    assert_eq!(status, 201, "{up}");
    let file_id = up["file_id"].as_str().unwrap().to_owned();
    let mut before = Vec::new();
    for base in &bases {
        before.push(series(base, STATELESS_OK).await);
    }
    for _ in 0..6 {
        let body = json!({
            "code": "print(sum(int(l) for l in open('d.csv').read().split()[1:]))",
            "files": [{"path": "d.csv", "file_id": file_id}],
        });
        let (status, _, r) = post(&lb.base, "/v1/execute", &body).await;
        assert_eq!((status, r["stdout"].as_str()), (200, Some("6\n")), "{r}");
    }
    for (base, before) in bases.iter().zip(&before) {
        let after = series(base, STATELESS_OK).await;
        assert!(after > *before, "{base} served none of the runs");
    }

    // A run's output, downloaded through each replica, byte-identical.
    let code = "open('out.bin', 'wb').write(bytes(range(256)) * 4000)";
    let (status, _, r) = post(&lb.base, "/v1/execute", &json!({ "code": code })).await;
    assert_eq!(status, 200, "{r}");
    let out_id = r["files"][0]["file_id"].as_str().unwrap().to_owned();
    let expected: Vec<u8> = (0..=255u8).cycle().take(256 * 4000).collect();
    for base in &bases {
        assert!(download(base, &out_id).await == (200, expected.clone()));
    }

    // A session created through the balancer, driven by 20 calls that land everywhere.
    let (status, _, created) = post(&lb.base, "/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["session_id"].as_str().unwrap().to_owned();
    let owner = IDS
        .iter()
        .position(|id| sid.starts_with(&format!("sess_{id}_")))
        .unwrap_or_else(|| panic!("{sid} names no replica"));
    let forwarded_before: Vec<f64> =
        futures_util::future::join_all(bases.iter().map(|b| series(b, FORWARDED))).await;
    let path = format!("/v1/sessions/{sid}/execute");
    let (status, _, r) = post(&lb.base, &path, &json!({"code": "n = 0"})).await;
    assert_eq!(status, 200, "{r}");
    for i in 1..=20 {
        let (status, headers, r) = post(&lb.base, &path, &json!({"code": "n += 1\nn"})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(headers["x-snakecage-served-by"], IDS[owner]);
        assert_eq!(r["results"][0]["text/plain"], i.to_string(), "{r}");
    }
    for (i, base) in bases.iter().enumerate() {
        let forwarded = series(base, FORWARDED).await - forwarded_before[i];
        if i == owner {
            assert_eq!(forwarded, 0.0);
        } else {
            assert!(forwarded >= 1.0, "replica {} forwarded nothing", IDS[i]);
        }
    }

    // Streaming through a forward: output arrives while the run is still going.
    let other = (owner + 1) % 3;
    let started = Instant::now();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{sid}/execute/stream", bases[other]))
        .json(&json!({"code": "import time\nprint('early', flush=True)\ntime.sleep(1)\nprint('late')\nn"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = read_events(resp, started, |_| false).await;
    let early = events.iter().find(|e| e.event == "output").unwrap();
    let result = events.iter().find(|e| e.event == "result").unwrap();
    assert!(early.data.to_string().contains("early"), "{:?}", events);
    assert!(
        result.at >= early.at + Duration::from_millis(500),
        "{events:?}"
    );
    assert!(result.data.to_string().contains("20"), "{events:?}");

    // A client that vanishes mid-stream through a forward: the owner sees the disconnect,
    // interrupts the run and the session is free again, its state intact.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{sid}/execute/stream", bases[other]))
        .json(&json!({"code": "import time\nprint('x', flush=True)\ntime.sleep(60)"}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let first = futures_util::StreamExt::next(&mut body).await;
    assert!(first.is_some_and(|c| c.is_ok()));
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, r) = post(&bases[owner], &path, &json!({"code": "n"})).await;
        if status == 200 {
            assert_eq!(r["results"][0]["text/plain"], "20", "{r}");
            break;
        }
        assert_eq!(status, 409, "{r}");
        assert!(Instant::now() < deadline, "the run was never interrupted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Code Mode through the balancer: a run's caller tool calls are answered, and a run is
    // cancelled, through replicas other than the one running it.
    let tool = json!([{"name": "lookup", "description": "Die Temperatur einer Stadt",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let code = "from snakecage import tools\n\
                print(sum(tools.lookup(city=c)['temp'] for c in ['Zürich', 'Genève', 'Chur']))";
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/execute/stream", lb.base))
        .json(&json!({"code": code, "tools": tool, "timeout_ms": 30000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let runner = IDS
        .iter()
        .position(|id| run_id.starts_with(&format!("run_{id}_")))
        .unwrap_or_else(|| panic!("{run_id} names no replica"));
    let mut events = Events::new(resp);
    for i in 1..=3 {
        let call = loop {
            let (event, data) = events.next().await.expect("the stream ended early");
            if event == "tool_call" {
                break data;
            }
        };
        let elsewhere = &bases[(runner + i) % 3];
        let path = format!(
            "/v1/runs/{run_id}/tool_calls/{}",
            call["call_id"].as_str().unwrap()
        );
        let (status, headers, r) = post(elsewhere, &path, &json!({"result": {"temp": i}})).await;
        assert_eq!(status, 204, "{r}");
        assert_eq!(headers["x-snakecage-served-by"], IDS[runner]);
    }
    let result = loop {
        let (event, data) = events.next().await.expect("no result");
        if event == "result" {
            break data;
        }
    };
    assert_eq!(result["stdout"], "6\n", "{result}");
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/execute/stream", lb.base))
        .json(&json!({"code": "import time\nprint('läuft', flush=True)\ntime.sleep(60)", "timeout_ms": 60000}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
    let runner = IDS
        .iter()
        .position(|id| run_id.starts_with(&format!("run_{id}_")))
        .unwrap_or_else(|| panic!("{run_id} names no replica"));
    let mut events = Events::new(resp);
    assert_eq!(events.next().await.unwrap().0, "output");
    let cancelled = reqwest::Client::new()
        .delete(format!("{}/v1/runs/{run_id}", bases[(runner + 1) % 3]))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 204);
    assert_eq!(cancelled.headers()["x-snakecage-served-by"], IDS[runner]);
    let result = loop {
        let (event, data) = events.next().await.expect("no result");
        if event == "result" {
            break data;
        }
    };
    assert_eq!(result["verdict"], "killed", "{result}");

    // The owner dies. Once HAProxy's checks drop it, stateless traffic sees no 5xx, its
    // session is 410 wherever asked, and every stored file is still served.
    let victim = replicas[owner].take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await; // fall 2 × inter 200 ms, and margin
    for _ in 0..15 {
        let (status, _, r) = post(&lb.base, "/v1/execute", &json!({"code": "print(1)"})).await;
        assert_eq!(status, 200, "{r}\n{}", lb.log());
    }
    for _ in 0..3 {
        let (status, _, r) = post(&lb.base, &path, &json!({"code": "n"})).await;
        assert_eq!(status, 410, "{r}");
        let detail = r["detail"].as_str().unwrap();
        assert!(
            detail.contains(IDS[owner]) && detail.contains("gone"),
            "{detail}"
        );
    }
    for id in [&file_id, &out_id] {
        for _ in 0..3 {
            let (status, bytes) = download(&lb.base, id).await;
            assert_eq!(status, 200);
            assert!(!bytes.is_empty());
        }
    }
    assert!(download(&lb.base, &out_id).await == (200, expected));
    drop(victim);
}
