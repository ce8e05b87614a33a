//! Package management under load: the time of an add (install + rollover) and of a
//! remove, and the latency of stateless requests while it runs, against the same window of
//! load before it. A release `snakecage` on a free loopback port with the repository's
//! `.venv`, the pinned uv and a warm cache (the first round warms it and is reported too).
//!
//! `cargo bench --bench packages -- [--rounds N] [--concurrency C] [--pool-size P]
//! [--spec SPEC] [--json PATH]`; `scripts/bench --packages` builds and runs it.

#[allow(dead_code)]
#[path = "load/stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "load/target.rs"]
mod target;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use stats::Summary;
use target::Server;

struct Options {
    rounds: usize,
    concurrency: usize,
    pool_size: usize,
    spec: String,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Options> {
    let mut o = Options {
        rounds: 3,
        concurrency: 4,
        pool_size: 4,
        spec: "tabulate==0.9.0".into(),
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--bench" => {}
            "--rounds" => o.rounds = value()?.parse()?,
            "--concurrency" => o.concurrency = value()?.parse()?,
            "--pool-size" => o.pool_size = value()?.parse()?,
            "--spec" => o.spec = value()?,
            "--json" => o.json = Some(value()?.into()),
            other => bail!(
                "unknown argument {other}; usage: packages [--rounds N] [--concurrency C] [--pool-size P] [--spec SPEC] [--json PATH]"
            ),
        }
    }
    Ok(o)
}

/// Closed-loop stateless requests on `c` clients until `stop`: each latency, and failures.
async fn load(
    server: Arc<Server>,
    c: usize,
    stop: Arc<AtomicBool>,
) -> (Vec<Duration>, Vec<String>) {
    let client = reqwest::Client::new();
    let body = json!({ "code": "print(1+1)" });
    let tasks: Vec<_> = (0..c)
        .map(|_| {
            let (server, client, body, stop) =
                (server.clone(), client.clone(), body.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match server.execute(&client, &body).await {
                        Ok(_) => latencies.push(t.elapsed()),
                        Err(e) => failures.push(e.to_string()),
                    }
                }
                (latencies, failures)
            })
        })
        .collect();
    let mut all = (Vec::new(), Vec::new());
    for task in tasks {
        let (l, f) = task.await.expect("load task");
        all.0.extend(l);
        all.1.extend(f);
    }
    all
}

/// One admin change under load: its answer, its wall time, and the load's latencies.
async fn change_under_load(
    server: &Arc<Server>,
    c: usize,
    method: reqwest::Method,
    body: Value,
) -> Result<(Value, Duration, Vec<Duration>, Vec<String>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(server.clone(), c, stop.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let resp = reqwest::Client::new()
        .request(method, format!("{}/v1/admin/packages", server.base()))
        .json(&body)
        .timeout(Duration::from_secs(1800))
        .send()
        .await?;
    let took = started.elapsed();
    let status = resp.status();
    let answer: Value = resp.json().await?;
    stop.store(true, Ordering::Relaxed);
    let (latencies, failures) = running.await?;
    if status != 200 {
        bail!("the change failed: {status} {answer}");
    }
    Ok((answer, took, latencies, failures))
}

/// The same load for `window`, with no change running.
async fn baseline(
    server: &Arc<Server>,
    c: usize,
    window: Duration,
) -> (Vec<Duration>, Vec<String>) {
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(server.clone(), c, stop.clone()));
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    running.await.expect("baseline load")
}

fn main() -> Result<()> {
    let o = parse_args()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let release = root.join("target/release");
    let env = vec![
        (
            "SNAKECAGE_PACKAGES__UV".to_owned(),
            root.join(".venv-tools/bin/uv").display().to_string(),
        ),
        (
            "SNAKECAGE_PACKAGES__CACHE_DIR".to_owned(),
            root.join("target/uv-cache-bench").display().to_string(),
        ),
    ];
    let server = Arc::new(Server::start(&release, o.pool_size, &env)?);
    let name = o
        .spec
        .split(['=', '<', '>', '~', '!', '[', ';', ' '])
        .next()
        .unwrap_or_default()
        .to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "package changes under a closed-loop load of {} clients (print(1+1)), pool size {}, {}",
        o.concurrency,
        o.pool_size,
        stats::loadavg()
    );
    let mut rows = Vec::new();
    let result = rt.block_on(async {
        for round in 1..=o.rounds {
            for (what, method, body) in [
                ("add", reqwest::Method::POST, json!({ "add": [o.spec] })),
                ("remove", reqwest::Method::DELETE, json!({ "remove": [name] })),
            ] {
                let (answer, took, during, failures) =
                    change_under_load(&server, o.concurrency, method, body).await?;
                server.wait_until_full(&reqwest::Client::new()).await?;
                let (before, base_failures) = baseline(&server, o.concurrency, took).await;
                let d = Summary::of(&during);
                let b = Summary::of(&before);
                println!(
                    "round {round} {what:6}: {:.2} s (install {} ms, rollover {} ms), generation {}; \
                     during: {} requests, {} failed, {}; steady: {} requests, {} failed, {}",
                    took.as_secs_f64(),
                    answer["install_ms"],
                    answer["rollover_ms"],
                    answer["generation"]["id"],
                    during.len(),
                    failures.len(),
                    d.describe(),
                    before.len(),
                    base_failures.len(),
                    b.describe(),
                );
                rows.push(json!({
                    "round": round, "change": what, "seconds": took.as_secs_f64(),
                    "install_ms": answer["install_ms"], "rollover_ms": answer["rollover_ms"],
                    "during": { "requests": during.len(), "failed": failures.len(), "latency": d.to_json() },
                    "steady": { "requests": before.len(), "failed": base_failures.len(), "latency": b.to_json() },
                }));
            }
        }
        anyhow::Ok(())
    });
    // Stopped whatever happened: a server left running would hold the terminal's pipes.
    drop(rt);
    Arc::try_unwrap(server)
        .map_err(|_| anyhow::anyhow!("the server is still shared"))?
        .stop();
    result?;
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
