//! What the in-process criterion benches share: a runtime, the default configuration with
//! the checkout's `.venv`, the service on a loopback port until its stop sender drops, and
//! the client calls they time (a run that must succeed, a new session).

use std::path::Path;
use std::time::Duration;

use snakecage::config::{Config, Overrides};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The defaults, with the checkout's `.venv`, state below `state_dir` and quiet logs.
pub fn config(state_dir: &Path) -> Config {
    let mut config = Config::load(None, &Overrides::default()).expect("config");
    config.python.venv = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    config.worker.state_dir = state_dir.to_path_buf();
    config.log.level = "warn".into();
    config
}

/// Serves `config` on a free loopback port; returns its base URL (`http://127.0.0.1:N`) and
/// the sender whose drop stops the service.
pub fn serve(rt: &Runtime, config: Config) -> (String, oneshot::Sender<()>) {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    rt.spawn(async move {
        snakecage::server::serve(listener, config, async {
            let _ = stopped.await;
        })
        .await
        .expect("serve");
    });
    (base, stop)
}

/// `POST` of `body` to a run URL (`/v1/execute` or a session's `/execute`), which must
/// answer 200 with exit code 0; returns the response.
pub async fn execute_ok(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let resp = client.post(url).json(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["exit_code"], 0, "{v}");
    v
}

/// Creates a session on the service at `base`; returns the URL its runs are posted to
/// (`{base}/v1/sessions/{id}/execute`).
pub async fn new_session(client: &reqwest::Client, base: &str) -> String {
    let resp = client
        .post(format!("{base}/v1/sessions"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status, 201, "{v}");
    let id = v["session_id"].as_str().unwrap();
    format!("{base}/v1/sessions/{id}/execute")
}

/// Polls `/health` every `interval` until the pool has at least `pool.size` idle workers (the
/// tiers keep a few more); returns `pool.size`.
pub async fn wait_until_full(client: &reqwest::Client, health: &str, interval: Duration) -> u64 {
    for _ in 0..(60_000 / interval.as_millis().max(1)) {
        if let Ok(resp) = client.get(health).send().await {
            let v: serde_json::Value = resp.json().await.unwrap();
            if v["pool"]["idle"].as_u64() >= v["pool"]["target_size"].as_u64() {
                return v["pool"]["target_size"].as_u64().unwrap();
            }
        }
        tokio::time::sleep(interval).await;
    }
    panic!("pool never filled");
}
