//! The server under load: a release `snakecage` started as its own process on a free
//! loopback port with the repository's `.venv`, its requests, and its shutdown.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub struct Server {
    child: Child,
    /// From spawning the process to a full pool of ready workers.
    pub started_in: Duration,
    base: String,
    _state: tempfile::TempDir,
}

impl Server {
    /// Starts `DIR/snakecage` (which finds `DIR/snakecage-worker` beside it) and waits until
    /// its pool is full.
    pub fn start(dir: &Path, pool_size: usize, env: &[(String, String)]) -> Result<Self> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let state = tempfile::tempdir()?;
        let mut cmd = Command::new(dir.join("snakecage"));
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--venv")
            .arg(root.join(".venv"))
            .arg("--pool-size")
            .arg(pool_size.to_string())
            .env("SNAKECAGE_WORKER__STATE_DIR", state.path())
            .env("SNAKECAGE_LOG__LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let spawned = std::time::Instant::now();
        let child = cmd.spawn().context("spawning snakecage")?;
        let mut server = Self {
            child,
            started_in: Duration::ZERO,
            base: format!("http://127.0.0.1:{port}"),
            _state: state,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(server.wait_until_full(&reqwest::Client::new()))?;
        server.started_in = spawned.elapsed();
        Ok(server)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One stateless execute; returns the `duration_ms` the server reported.
    pub async fn execute(&self, client: &reqwest::Client, body: &serde_json::Value) -> Result<u64> {
        let resp = client
            .post(format!("{}/v1/execute", self.base))
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        let v: serde_json::Value = resp.json().await?;
        if status != 200 || v["exit_code"] != 0 {
            bail!("execute failed: {status} {v}");
        }
        v["duration_ms"].as_u64().context("no duration_ms")
    }

    /// Polls `/health` every 2 ms until every tier has its idle target and nothing is
    /// starting (60 s at most).
    pub async fn wait_until_full(&self, client: &reqwest::Client) -> Result<()> {
        let url = format!("{}/health", self.base);
        for _ in 0..30_000 {
            if let Ok(resp) = client.get(&url).send().await
                && let Ok(v) = resp.json::<serde_json::Value>().await
                && pool_is_full(&v["pool"])
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        bail!("the pool of {} never filled", self.base)
    }

    /// SIGTERM, then wait (the server kills its zygote and workers on the way out).
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..500 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every tier holds at least its idle target and none is starting a worker (a service still
/// starting reports no tiers: not full).
fn pool_is_full(pool: &serde_json::Value) -> bool {
    let Some(tiers) = pool["tiers"].as_array() else {
        return pool["idle"].as_u64().is_some()
            && pool["idle"].as_u64() >= pool["target_size"].as_u64();
    };
    !tiers.is_empty()
        && tiers.iter().all(|t| {
            t["idle"].as_u64() >= t["target_idle"].as_u64() && t["spawning"].as_u64() == Some(0)
        })
}
