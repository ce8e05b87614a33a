//! End-to-end `POST /v1/execute` over loopback HTTP against a real server (real zygote,
//! real pre-forked workers), as a client sees it.
//!
//! Needs the release zygote: `cargo build --release -p snakecage-worker`, then
//! `cargo bench --bench execute`. Uses `.venv` (numpy, pandas and matplotlib preloaded).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use snakecage::config::{Config, Overrides};
use tokio::runtime::Runtime;

struct Bench {
    rt: Runtime,
    client: reqwest::Client,
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    _state: tempfile::TempDir,
}

fn start() -> Bench {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut config = Config::load(None, &Overrides::default()).expect("config");
    config.python.venv = Some(std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    config.worker.state_dir = state.path().to_path_buf();
    config.log.level = "warn".into();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}/v1/execute", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(async move {
        snakecage::server::serve(listener, config, async {
            let _ = stopped.await;
        })
        .await
        .expect("serve");
    });
    let client = reqwest::Client::new();
    // Wait until the pool is full.
    let health = url.replace("/v1/execute", "/health");
    rt.block_on(async {
        for _ in 0..600 {
            if let Ok(resp) = client.get(&health).send().await {
                let v: serde_json::Value = resp.json().await.unwrap();
                if v["pool"]["idle"] == v["pool"]["target_size"] {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("pool never filled");
    });
    Bench {
        rt,
        client,
        url,
        _stop: stop,
        _state: state,
    }
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
            bench.to_async(&b.rt).iter(|| async {
                let resp = b.client.post(&b.url).json(&body).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                let v: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(v["exit_code"], 0, "{v}");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, execute);
criterion_main!(benches);
