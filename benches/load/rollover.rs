//! `--rollover`: what a rollover costs the traffic around it. For each round, `c` clients
//! run `print(1+1)` back to back; first for `seconds` with nothing else happening (before),
//! then while `POST /v1/admin/reload?force=true` (the configuration is unchanged: forced,
//! it rolls over all the same) starts, stocks and probes a new generation and
//! switches to it (during). Reports the switch time (the reload's wall time and the
//! `took_ms` it answers), p50/p99 of the requests started before and during it, and every
//! failed request (there should be none).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::stats::Summary;
use super::target::Server;

pub struct RolloverRow {
    pub reload_wall: Duration,
    pub took_ms: u64,
    pub before: Summary,
    pub before_n: usize,
    pub during: Summary,
    pub during_n: usize,
    pub failures: Vec<String>,
}

impl RolloverRow {
    pub fn to_json(&self) -> Value {
        json!({
            "reload_wall_ms": self.reload_wall.as_secs_f64() * 1e3,
            "took_ms": self.took_ms,
            "before": self.before.to_json(), "before_n": self.before_n,
            "during": self.during.to_json(), "during_n": self.during_n,
            "failures": self.failures,
        })
    }
}

/// One request; the failure, if it failed.
async fn one(client: &reqwest::Client, url: &str, body: &Value) -> Result<(), String> {
    let resp = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let v: Value = resp.json().await.map_err(|e| e.to_string())?;
    if status != 200 || v["stdout"] != "2\n" {
        return Err(format!("{status} {v}"));
    }
    Ok(())
}

/// Runs `c` closed-loop clients until `stop`; returns each request's start and latency,
/// and the failures.
async fn clients(
    base: String,
    c: usize,
    stop: Arc<AtomicBool>,
) -> (Vec<(Instant, Duration)>, Vec<String>) {
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let url = format!("{base}/v1/execute");
    let body = json!({ "code": "print(1+1)" });
    let loops = (0..c).map(|_| {
        let (client, url, body, stop) = (client.clone(), url.clone(), body.clone(), stop.clone());
        async move {
            let mut samples = Vec::new();
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                match one(&client, &url, &body).await {
                    Ok(()) => samples.push((t0, t0.elapsed())),
                    Err(e) => failures.push(e),
                }
            }
            (samples, failures)
        }
    });
    let mut all = Vec::new();
    let mut failed = Vec::new();
    for (samples, failures) in futures_util::future::join_all(loops).await {
        all.extend(samples);
        failed.extend(failures);
    }
    (all, failed)
}

pub async fn measure(server: &Server, concurrency: usize, seconds: f64) -> Result<RolloverRow> {
    let base = server.base().to_owned();
    let window = Duration::from_secs_f64(seconds);
    // Before: the same clients, nothing else happening.
    let stop = Arc::new(AtomicBool::new(false));
    let before = tokio::spawn(clients(base.clone(), concurrency, stop.clone()));
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let (before, mut failures) = before.await?;
    server.wait_until_full(&reqwest::Client::new()).await?;

    // During: the clients run, a reload starts after a short while and is timed.
    let stop = Arc::new(AtomicBool::new(false));
    let during = tokio::spawn(clients(base.clone(), concurrency, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/admin/reload?force=true"))
        .send()
        .await?;
    let status = resp.status();
    let answer: Value = resp.json().await?;
    let reload_wall = t0.elapsed();
    let t1 = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (samples, during_failures) = during.await?;
    failures.extend(during_failures);
    if status != 200 {
        bail!("reload failed: {status} {answer}");
    }
    let took_ms = answer["took_ms"].as_u64().context("no took_ms")?;
    let during: Vec<Duration> = samples
        .iter()
        .filter(|(start, _)| *start >= t0 && *start <= t1)
        .map(|(_, latency)| *latency)
        .collect();
    let before: Vec<Duration> = before.iter().map(|(_, latency)| *latency).collect();
    Ok(RolloverRow {
        reload_wall,
        took_ms,
        before: Summary::of(&before),
        before_n: before.len(),
        during: Summary::of(&during),
        during_n: during.len(),
        failures,
    })
}
