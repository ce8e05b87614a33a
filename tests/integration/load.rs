//! Stateless load for the rollover and package tests: `c` clients running `print` in a
//! loop (non-ASCII output, a different value per request), every answer checked, until
//! stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::harness::Server;

/// Stateless requests in a loop on `c` connections until stopped: (succeeded, failures).
pub struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

impl Load {
    pub fn start(s: &Server, c: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let tasks = (0..c)
            .map(|i| {
                let (stop, ok) = (stop.clone(), ok.clone());
                let (client, base) = (s.client.clone(), s.base.clone());
                tokio::spawn(async move {
                    let mut failures = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let code = format!("print('λ', {i} * 1000 + {n} % 1000)");
                        let want = format!("λ {}\n", i as u64 * 1000 + n % 1000);
                        let result = client
                            .post(format!("{base}/v1/execute"))
                            .json(&json!({ "code": code, "timeout_ms": 30000 }))
                            .send()
                            .await;
                        match result {
                            Ok(resp) if resp.status() == 200 => {
                                let body: Value = resp.json().await.unwrap_or_default();
                                if body["stdout"] == want.as_str() && body["exit_code"] == 0 {
                                    ok.fetch_add(1, Ordering::Relaxed);
                                } else {
                                    failures.push(body.to_string());
                                }
                            }
                            Ok(resp) => failures.push(format!(
                                "{}: {}",
                                resp.status(),
                                resp.text().await.unwrap_or_default()
                            )),
                            Err(e) => failures.push(e.to_string()),
                        }
                    }
                    failures
                })
            })
            .collect();
        Self { stop, ok, tasks }
    }

    /// Stops the clients; returns (succeeded, failures).
    pub async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut failures = Vec::new();
        for task in self.tasks {
            failures.extend(task.await.unwrap());
        }
        (self.ok.load(Ordering::Relaxed), failures)
    }
}
