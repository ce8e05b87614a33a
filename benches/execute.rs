//! End-to-end `POST /v1/execute` over loopback HTTP against a real server (real zygote,
//! real pre-forked workers), as a client sees it:
//!
//! - `execute/*`: one stateless execute, sequentially (print(1+1), a numpy/pandas groupby);
//! - `execute_with_file/staged_1mb`: an execute that stages a 1 MiB stored file first;
//! - `pool_refill/burst`: `pool.size` concurrent executes from a full pool until the pool is
//!   full again, i.e. the sustained rate at which the pool serves and replaces workers
//!   (reported as workers per second).
//!
//! Needs the release zygote: `cargo build --release -p snakecage-worker`, then
//! `cargo bench --bench execute`. Uses `.venv` (numpy, pandas and matplotlib preloaded).

use std::time::Duration;

use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use tokio::runtime::Runtime;

mod common;

struct Bench {
    rt: Runtime,
    client: reqwest::Client,
    url: String,
    health: String,
    pool_size: u64,
    _stop: tokio::sync::oneshot::Sender<()>,
    _state: tempfile::TempDir,
}

fn start() -> Bench {
    let rt = common::runtime();
    let state = tempfile::tempdir().unwrap();
    let (base, stop) = common::serve(&rt, common::config(state.path()));
    let url = format!("{base}/v1/execute");
    let client = reqwest::Client::new();
    let health = url.replace("/v1/execute", "/health");
    let pool_size = rt.block_on(common::wait_until_full(
        &client,
        &health,
        Duration::from_millis(50),
    ));
    Bench {
        rt,
        client,
        url,
        health,
        pool_size,
        _stop: stop,
        _state: state,
    }
}

async fn execute_ok(b: &Bench, body: &serde_json::Value) -> serde_json::Value {
    common::execute_ok(&b.client, &b.url, body).await
}

fn execute(c: &mut Criterion) {
    let b = start();
    let mut group = c.benchmark_group("execute");
    group.measurement_time(Duration::from_secs(10));
    for (name, code) in [
        ("print_1_plus_1", "print(1+1)"),
        (
            "numpy_pandas_aggregate",
            "import numpy as np, pandas as pd\ndf = pd.DataFrame({'k': np.arange(1000) % 7, 'v': np.arange(1000.0)})\nprint(df.groupby('k')['v'].sum().iloc[3])",
        ),
    ] {
        let body = json!({ "code": code });
        group.bench_function(name, |bench| {
            bench.to_async(&b.rt).iter(|| execute_ok(&b, &body))
        });
    }
    group.finish();

    execute_with_file(c, &b);
    pool_refill(c, &b);
    session_execute(c, &b);
    stream_first_byte(c, &b);
}

/// One session (its worker kept), then `x += 1` runs in it: globals persist, no fork.
fn session_execute(c: &mut Criterion, b: &Bench) {
    let base = b.url.trim_end_matches("/v1/execute");
    let run_url = b.rt.block_on(async {
        let url = common::new_session(&b.client, base).await;
        common::execute_ok(&b.client, &url, &json!({"code": "x = 0"})).await;
        url
    });
    let body = json!({ "code": "x += 1" });
    let mut group = c.benchmark_group("session");
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("execute_in_session", |bench| {
        bench
            .to_async(&b.rt)
            .iter(|| common::execute_ok(&b.client, &run_url, &body))
    });
    group.finish();
}

/// `POST /v1/execute/stream` of a program that prints, then sleeps 50 ms, then prints:
/// the time until the first SSE `output` event reaches the client (the rest of the stream
/// is read to the end outside the measured time).
fn stream_first_byte(c: &mut Criterion, b: &Bench) {
    use futures_util::StreamExt;
    let url = format!("{}/stream", b.url);
    let body = json!({ "code": "import time\nprint('first', flush=True)\ntime.sleep(0.05)\nprint('last')" });
    let mut group = c.benchmark_group("stream");
    group.measurement_time(Duration::from_secs(10));
    group.sample_size(30);
    group.bench_function("first_output_event", |bench| {
        bench.to_async(&b.rt).iter_custom(|iters| {
            let (url, body) = (&url, &body);
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t0 = Instant::now();
                    let resp = b.client.post(url).json(body).send().await.unwrap();
                    assert_eq!(resp.status(), 200);
                    let mut stream = resp.bytes_stream();
                    let mut seen = Vec::new();
                    while let Some(chunk) = stream.next().await {
                        seen.extend_from_slice(&chunk.unwrap());
                        if seen.windows(13).any(|w| w == b"event: output") {
                            break;
                        }
                    }
                    total += t0.elapsed();
                    while stream.next().await.is_some() {}
                }
                total
            }
        })
    });
    group.finish();
}

/// Uploads 1 MiB once through `POST /v1/files`, then stages it into every execute.
fn execute_with_file(c: &mut Criterion, b: &Bench) {
    const SIZE: usize = 1 << 20;
    let files_url = b.url.replace("/v1/execute", "/v1/files");
    let file_id = b.rt.block_on(async {
        let part = reqwest::multipart::Part::bytes(vec![7u8; SIZE]).file_name("data.bin");
        let form = reqwest::multipart::Form::new().part("file", part);
        let resp = b
            .client
            .post(&files_url)
            .multipart(form)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let v: serde_json::Value = resp.json().await.unwrap();
        v["file_id"].as_str().unwrap().to_owned()
    });
    let body = json!({
        "code": "import os\nprint(os.path.getsize('data.bin'))",
        "files": [{"path": "data.bin", "file_id": file_id}],
    });
    let mut group = c.benchmark_group("execute_with_file");
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("staged_1mb", |bench| {
        bench.to_async(&b.rt).iter(|| async {
            let v = execute_ok(b, &body).await;
            assert_eq!(v["stdout"], format!("{SIZE}\n"));
        })
    });
    group.finish();
}

/// From a full pool: `pool.size` executes at once, then wait (polling `/health` every
/// 0.2 ms) until the pool is full again. The time per iteration is what serving and
/// replacing a pool's worth of workers costs; criterion reports it as workers per second.
fn pool_refill(c: &mut Criterion, b: &Bench) {
    let body = &json!({ "code": "print(1+1)" });
    let mut group = c.benchmark_group("pool_refill");
    group.measurement_time(Duration::from_secs(10));
    group.sample_size(20);
    group.throughput(Throughput::Elements(b.pool_size));
    group.bench_function("burst", |bench| {
        bench.to_async(&b.rt).iter_custom(|iters| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                let burst = (0..b.pool_size).map(|_| execute_ok(b, body));
                futures_util::future::join_all(burst).await;
                common::wait_until_full(&b.client, &b.health, Duration::from_micros(200)).await;
                total += t0.elapsed();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, execute);
criterion_main!(benches);
