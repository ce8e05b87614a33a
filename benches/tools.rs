//! Code Mode: the round trip of a tool call from sandboxed Python through the supervisor
//! and back, measured inside one session (its worker kept, so no fork is in the timing):
//!
//! - `tool_calls/loop_1000_no_calls`: a session run of a 1,000-iteration Python loop that
//!   calls nothing (the baseline: the run's own cost);
//! - `tool_calls/loop_1000_http_noop`: the same loop calling a no-op HTTP tool served on
//!   loopback 1,000 times (`[[tools.http]]`: the worker's frame, the supervisor's checks,
//!   reqwest to a local axum handler and back);
//! - `dispatch/loop_1000_refused`: on a server whose runs may make one call, the same loop
//!   catching `ToolLimitError` 999 times: each is a full round trip (worker frame out, the
//!   supervisor's loop and checks, the answer frame back) without a provider, i.e. the
//!   dispatch overhead.
//!
//! - `fan_out/sequential_8x100ms` and `fan_out/thread_pool_8x100ms`: 8 calls of a tool
//!   that sleeps 100 ms before answering, made one after the other, then fanned out over a
//!   `ThreadPoolExecutor(8)` (`tools.max_concurrent_calls` is 8 by default): concurrent
//!   calls make the second about as long as one call, the first about as long as eight.
//!   `fan_out/asyncio_gather_8x100ms` is the same fan-out as an agent writes it with
//!   asyncio: `await asyncio.gather(...)` over `tools.aio.sleep()`, on the async tier.
//!
//! Per call: (loop − loop_1000_no_calls) / 1000. Fan-out: sequential / thread_pool is the
//! speed-up (8 at best).
//!
//! Needs the release zygote: `cargo build --release -p snakecage-worker`, then
//! `cargo bench --bench tools`.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use snakecage::config::HttpToolConfig;
use tokio::runtime::Runtime;

mod common;

const CALLS: u64 = 1000;

/// The fan-out group: calls per run, and how long the tool takes to answer each.
const FAN_OUT: u64 = 8;
const SLEEP: Duration = Duration::from_millis(100);

struct Bench {
    rt: Runtime,
    client: reqwest::Client,
    run_url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    _state: tempfile::TempDir,
}

fn start(max_calls: u64) -> Bench {
    let rt = common::runtime();
    // The no-op tool: a loopback HTTP endpoint answering `{}`.
    let tool_listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let tool_url = format!("http://{}/noop", tool_listener.local_addr().unwrap());
    rt.spawn(async move {
        let app = axum::Router::new()
            .route(
                "/noop",
                axum::routing::post(|| async { axum::Json(json!({})) }),
            )
            .route(
                "/sleep",
                axum::routing::post(|| async {
                    tokio::time::sleep(SLEEP).await;
                    axum::Json(json!({}))
                }),
            );
        axum::serve(tool_listener, app).await.unwrap();
    });
    let state = tempfile::tempdir().unwrap();
    let mut config = common::config(state.path());
    config.tools.max_calls_per_run = max_calls as u32;
    for (name, description) in [("noop", "Does nothing"), ("sleep", "Sleeps, then answers")] {
        config.tools.http.push(HttpToolConfig {
            name: name.into(),
            description: description.into(),
            parameters: json!({"type": "object"}),
            url: tool_url.replace("/noop", &format!("/{name}")),
            method: "POST".into(),
            headers: Default::default(),
            headers_from_env: Default::default(),
            tenants: None,
        });
    }
    let (base, stop) = common::serve(&rt, config);
    let client = reqwest::Client::new();
    let run_url = rt.block_on(async {
        // Sessions answer 503 until the zygotes have forked their first workers.
        common::wait_until_full(
            &client,
            &format!("{base}/health"),
            Duration::from_millis(100),
        )
        .await;
        common::new_session(&client, &base).await
    });
    Bench {
        rt,
        client,
        run_url,
        _stop: stop,
        _state: state,
    }
}

async fn run_ok(b: &Bench, body: &serde_json::Value) {
    common::execute_ok(&b.client, &b.run_url, body).await;
}

fn tool_calls(c: &mut Criterion) {
    let b = start(CALLS);
    let mut group = c.benchmark_group("tool_calls");
    group.measurement_time(Duration::from_secs(15));
    group.sample_size(20);
    group.throughput(Throughput::Elements(CALLS));
    for (name, code) in [
        (
            "loop_1000_no_calls",
            "from snakecage import tools\nfor _ in range(1000):\n    pass",
        ),
        (
            "loop_1000_http_noop",
            "from snakecage import tools\nfor _ in range(1000):\n    tools.noop()",
        ),
    ] {
        let body = json!({ "code": code, "timeout_ms": 60000 });
        group.bench_function(name, |bench| {
            bench.to_async(&b.rt).iter(|| run_ok(&b, &body))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("fan_out");
    group.measurement_time(Duration::from_secs(15));
    group.sample_size(10);
    group.throughput(Throughput::Elements(FAN_OUT));
    for (name, code) in [
        (
            "sequential_8x100ms",
            format!("from snakecage import tools\nfor _ in range({FAN_OUT}):\n    tools.sleep()"),
        ),
        (
            "thread_pool_8x100ms",
            format!(
                "from snakecage import tools\nfrom concurrent.futures import ThreadPoolExecutor\n\
                 with ThreadPoolExecutor({FAN_OUT}) as pool:\n    \
                 list(pool.map(lambda _: tools.sleep(), range({FAN_OUT})))"
            ),
        ),
        (
            "asyncio_gather_8x100ms",
            format!(
                "import asyncio\nfrom snakecage import tools\n\
                 await asyncio.gather(*(tools.aio.sleep() for _ in range({FAN_OUT})))"
            ),
        ),
    ] {
        let body = json!({ "code": code, "timeout_ms": 60000 });
        group.bench_function(name, |bench| {
            bench.to_async(&b.rt).iter(|| run_ok(&b, &body))
        });
    }
    group.finish();
    drop(b);

    let b = start(1);
    let mut group = c.benchmark_group("dispatch");
    group.measurement_time(Duration::from_secs(15));
    group.sample_size(20);
    group.throughput(Throughput::Elements(CALLS));
    let code = "from snakecage import tools\nfor _ in range(1000):\n    try:\n        tools.noop()\n    except tools.ToolLimitError:\n        pass";
    let body = json!({ "code": code, "timeout_ms": 60000 });
    group.bench_function("loop_1000_refused", |bench| {
        bench.to_async(&b.rt).iter(|| run_ok(&b, &body))
    });
    group.finish();
}

criterion_group!(benches, tool_calls);
criterion_main!(benches);
