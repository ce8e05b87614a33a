//! Backpressure: under overload the service sheds load explicitly (429 with Retry-After
//! when the queue is full, 503 after `queue_timeout_ms`) and its probes keep answering.
//! Loopback only, bounded in count and time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use snakecage::metrics::names;

use crate::harness::{Options, Server, rss};

const EXECUTIONS: &str = names::EXECUTIONS_TOTAL;

fn sleeper(secs: f64) -> Value {
    json!({"code": format!("import time\ntime.sleep({secs})"), "timeout_ms": 10_000})
}

#[tokio::test]
async fn a_request_that_waits_past_the_queue_timeout_gets_503_and_is_counted_as_shed() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 1)
            .env("SNAKECAGE_POOL__QUEUE_TIMEOUT_MS", 300),
    )
    .await;
    let busy = {
        let (client, url) = (s.client.clone(), format!("{}/v1/execute", s.base));
        tokio::spawn(async move { client.post(url).json(&sleeper(2.0)).send().await })
    };
    s.wait_for_pool("the sleeper running", |p| p["busy"] == 1)
        .await;
    let started = Instant::now();
    let (status, body) = s.post("/v1/execute", &json!({"code": "print(1)"})).await;
    let waited = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("within 300 ms"),
        "{body}"
    );
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(busy.await.unwrap().unwrap().status(), 200);

    let m = s.scrape().await;
    let stateless = |outcome| [("kind", "stateless"), ("outcome", outcome)];
    assert_eq!(m.get(EXECUTIONS, &stateless("rejected")), 1.0);
    assert_eq!(m.get(EXECUTIONS, &stateless("ok")), 1.0);
    assert_eq!(
        m.get(
            names::QUEUE_REJECTIONS_TOTAL,
            &[("reason", "queue_timeout")]
        ),
        1.0
    );
    let http_503 = m.get(
        names::HTTP_REQUESTS_TOTAL,
        &[("route", "/v1/execute"), ("status", "503")],
    );
    assert_eq!(http_503, 1.0);
}

/// A stream refused at once gets the status a plain execute gets (429 with `Retry-After`),
/// not a 200 whose only event is the error; one that waits in the queue streams.
#[tokio::test]
async fn a_stream_refused_by_a_full_queue_gets_429_before_any_event() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 1)
            .env("SNAKECAGE_POOL__QUEUE_LENGTH", 1),
    )
    .await;
    let post = |path: &str, body: Value| {
        let (client, url) = (s.client.clone(), format!("{}{path}", s.base));
        async move { client.post(url).json(&body).send().await.unwrap() }
    };
    let busy = tokio::spawn(post("/v1/execute", sleeper(1.5)));
    s.wait_for_pool("the sleeper running", |p| p["busy"] == 1)
        .await;
    // Waits in the queue's one place: its stream starts, its result comes later.
    let queued = post("/v1/execute/stream", json!({"code": "print('später')"})).await;
    assert_eq!(queued.status(), 200);
    let refused = post("/v1/execute/stream", json!({"code": "print(1)"})).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "queue_full", "{body}");
    let text = queued.text().await.unwrap();
    assert!(text.contains("event: result"), "{text}");
    assert!(text.contains("später"), "{text}");
    assert_eq!(busy.await.unwrap().status(), 200);
}

#[tokio::test]
async fn health_ready_and_metrics_keep_answering_while_every_worker_is_busy() {
    let s = Server::start_with(Options::default().env("SNAKECAGE_POOL__QUEUE_LENGTH", 4)).await;
    let mut running = Vec::new();
    for _ in 0..4 {
        let (client, url) = (s.client.clone(), format!("{}/v1/execute", s.base));
        running.push(tokio::spawn(async move {
            client
                .post(url)
                .json(&sleeper(2.0))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    // Both workers busy, two requests queued.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pool = &s.health().await["pool"];
        if pool["busy"] == 2 && pool["queue_depth"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{pool}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for path in ["/health", "/ready", "/metrics", "/v1/status"] {
        let started = Instant::now();
        let (status, _, _) = s.get(path).await;
        let took = started.elapsed();
        assert_eq!(status, 200, "{path}");
        assert!(took < Duration::from_millis(500), "{path} took {took:?}");
    }
    let m = s.scrape().await;
    assert_eq!(m.get(names::POOL_BUSY_WORKERS, &[]), 2.0);
    assert_eq!(m.get(names::POOL_QUEUE_DEPTH, &[]), 2.0);
    for task in running {
        assert_eq!(task.await.unwrap(), 200);
    }
}

/// What the load test's clients saw.
#[derive(Debug, Default)]
struct Tally {
    statuses: BTreeMap<u16, u64>,
    /// Requests that got no HTTP response at all.
    lost: u64,
    wrong_output: u64,
}

/// 10,000 trivial requests at concurrency 64 against a pool of 4 (queue of 48, so about a
/// dozen clients at a time are shed and back off): every
/// request is answered, only with 200 or the documented shedding (429 + Retry-After,
/// 503 on a queue timeout), the supervisor's memory stays flat, and the metrics agree with
/// what the clients counted. Long for the regular suite on two cores: `scripts/test` runs
/// it on its own.
#[tokio::test]
#[ignore = "load test (10,000 requests); scripts/test runs it separately"]
async fn ten_thousand_requests_at_concurrency_64_are_answered_or_shed_and_counted() {
    const REQUESTS: usize = 10_000;
    const CONCURRENCY: usize = 64;
    const WARM_UP: usize = 200;
    let s = Arc::new(
        Server::start_with(
            Options::default()
                .env("SNAKECAGE_POOL__SIZE", 4)
                .env("SNAKECAGE_POOL__QUEUE_LENGTH", 48)
                .env("RUST_LOG", "warn,snakecage::server=info"),
        )
        .await,
    );
    s.wait_for_idle(4).await;
    let body = json!({"code": "print(1)"});
    for _ in 0..WARM_UP {
        assert_eq!(s.run("print(1)").await["stdout"], "1\n");
    }
    let rss_before = rss(s.pid());
    let before = s.scrape().await;

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, next, body) = (client.clone(), next.clone(), body.clone());
        let url = format!("{}/v1/execute", s.base);
        clients.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while next.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                let resp = match client.post(&url).json(&body).send().await {
                    Ok(resp) => resp,
                    Err(_) => {
                        tally.lost += 1;
                        continue;
                    }
                };
                let status = resp.status().as_u16();
                let retry_after = resp.headers().get("retry-after").cloned();
                match resp.json::<Value>().await {
                    Ok(v) if status == 200 && v["stdout"] != "1\n" => tally.wrong_output += 1,
                    Ok(v) if status == 503 => {
                        assert!(
                            v["detail"]
                                .as_str()
                                .unwrap()
                                .contains("no worker became free")
                        )
                    }
                    Ok(_) => {}
                    Err(_) => tally.lost += 1,
                }
                *tally.statuses.entry(status).or_default() += 1;
                if status == 429 {
                    // A well-behaved client backs off (for less than Retry-After's second,
                    // to keep the test short).
                    assert_eq!(retry_after.unwrap(), "1");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for c in clients {
        let tally = tokio::time::timeout(Duration::from_secs(600), c)
            .await
            .expect("the load test finishes within 10 minutes")
            .unwrap();
        for (status, n) in tally.statuses {
            *total.statuses.entry(status).or_default() += n;
        }
        total.lost += tally.lost;
        total.wrong_output += tally.wrong_output;
    }
    let elapsed = started.elapsed();
    let rss_after = rss(s.pid());
    let after = s.scrape().await;
    let count = |status: u16| total.statuses.get(&status).copied().unwrap_or(0) as f64;
    eprintln!(
        "load test: {REQUESTS} requests at concurrency {CONCURRENCY} in {elapsed:.1?} \
         ({:.0}/s); statuses {:?}; lost {}; RSS {:.1} MiB before, {:.1} MiB after",
        REQUESTS as f64 / elapsed.as_secs_f64(),
        total.statuses,
        total.lost,
        rss_before as f64 / 1048576.0,
        rss_after as f64 / 1048576.0,
    );

    assert_eq!(total.lost, 0, "every request got a response");
    assert_eq!(total.wrong_output, 0);
    assert_eq!(total.statuses.values().sum::<u64>(), REQUESTS as u64);
    let unexpected: Vec<_> = total
        .statuses
        .keys()
        .filter(|s| ![200, 429, 503].contains(*s))
        .collect();
    assert!(unexpected.is_empty(), "{:?}", total.statuses);
    // Under this overload the pool still does useful work (about a third is served here).
    assert!(count(200) >= (REQUESTS / 10) as f64, "{:?}", total.statuses);
    // Memory flat: 10,000 requests leave the supervisor about where the warm-up left it.
    assert!(
        rss_after < rss_before + (32 << 20),
        "RSS grew from {rss_before} to {rss_after}"
    );

    let delta = |name: &str, labels: &[(&str, &str)]| {
        after.get_or_zero(name, labels) - before.get_or_zero(name, labels)
    };
    let stateless = |outcome| [("kind", "stateless"), ("outcome", outcome)];
    assert_eq!(delta(EXECUTIONS, &stateless("ok")), count(200));
    assert_eq!(
        delta(EXECUTIONS, &stateless("rejected")),
        count(429) + count(503)
    );
    assert_eq!(
        delta(names::QUEUE_REJECTIONS_TOTAL, &[("reason", "queue_full")]),
        count(429)
    );
    assert_eq!(
        delta(
            names::QUEUE_REJECTIONS_TOTAL,
            &[("reason", "queue_timeout")]
        ),
        count(503)
    );
    for status in [200, 429, 503] {
        let code = status.to_string();
        assert_eq!(
            delta(
                names::HTTP_REQUESTS_TOTAL,
                &[("route", "/v1/execute"), ("status", code.as_str())]
            ),
            count(status),
            "HTTP {status}"
        );
    }
    assert_eq!(after.sum(names::WORKERS_KILLED_TOTAL, &[]), 0.0);
    assert_eq!(after.get(names::ZYGOTE_RESTARTS_TOTAL, &[]), 0.0);
    assert!(elapsed < Duration::from_secs(600));
}
