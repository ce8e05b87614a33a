//! A session run waits in the pool's queue like any other when every slot is busy. A
//! client that goes away while its run waits there (an agent's HTTP timeout, a retry)
//! leaves nothing behind: the run never starts, the session is free again at once, its
//! state untouched, streamed or not.

use serde_json::{Value, json};

use crate::harness::{Options, Server};
use crate::reliability::eventually;

/// The pool's `busy` and `queue_depth` now.
async fn pool(s: &Server) -> (u64, u64) {
    let health = s.health().await;
    let pool = &health["pool"];
    (
        pool["busy"].as_u64().unwrap(),
        pool["queue_depth"].as_u64().unwrap(),
    )
}

async fn session_status(s: &Server, id: &str) -> Value {
    let (status, detail) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    detail["status"].clone()
}

#[tokio::test]
async fn a_queued_session_run_whose_client_leaves_never_runs_and_frees_the_session() {
    // One slot, runs that may hold it for longer than the test lasts, and a queue that
    // keeps a waiting run as long.
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 1)
            .env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", 600_000)
            .env("SNAKECAGE_POOL__QUEUE_TIMEOUT_MS", 600_000),
    )
    .await;
    let id = s.new_session().await;
    s.session_run(&id, "x = 1").await;
    for route in ["execute", "execute/stream"] {
        // A stateless run holds the only slot until its own client leaves.
        let holder = s.spawn_execute(json!({
            "code": "import time\ntime.sleep(300)",
            "timeout_ms": 600_000,
        }));
        eventually(60, "the slot is taken", async || pool(&s).await.0 == 1).await;

        let request = s
            .client
            .post(format!("{}/v1/sessions/{id}/{route}", s.base))
            .json(&json!({ "code": "x += 100" }));
        // A stream answers its headers at once, its run waiting in the queue behind them.
        let queued = tokio::spawn(async move { request.send().await.unwrap() });
        eventually(60, "the session run waits in the queue", async || {
            pool(&s).await.1 == 1
        })
        .await;
        assert_eq!(session_status(&s, &id).await, "busy");
        queued.abort();
        if let Ok(response) = queued.await {
            assert_eq!(response.status(), 200);
            drop(response);
        }

        // Its client gone, the run leaves the queue and the session, while the slot is
        // still held: without that it would stay busy until the slot is free, then run.
        eventually(60, "the session is free again", async || {
            session_status(&s, &id).await == "idle"
        })
        .await;
        assert_eq!(pool(&s).await, (1, 0), "{route}");

        holder.abort();
        eventually(60, "the slot is free again", async || pool(&s).await.0 == 0).await;
        let r = s.session_run(&id, "print(x)").await;
        assert_eq!(r["stdout"], "1\n", "{route}: the abandoned cell ran: {r}");
    }
    // Neither abandoned run counts as an execution: only the three that ran do, all ok.
    let (_, _, metrics) = s.get("/metrics").await;
    let session: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("snakecage_executions_total{kind=\"session\""))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert_eq!(
        session,
        ["snakecage_executions_total{kind=\"session\",outcome=\"ok\"} 3"]
    );
}
