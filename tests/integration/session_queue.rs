//! A session run waits in the pool's queue like any other when every slot is busy. A
//! client that goes away while its run waits there (an agent's HTTP timeout, a retry)
//! leaves nothing behind: the run never starts, the session is free again at once, its
//! state untouched, streamed or not. A run cancelled there (`DELETE /v1/runs/{id}`),
//! stateless or in a session, never starts either, and its client is told so at once.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Options, Server};
use crate::reliability::eventually;
use crate::streamed::StreamedRun;

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

/// One slot, runs that may hold it for longer than the test lasts, and a queue that keeps
/// a waiting run as long.
async fn one_slot() -> Server {
    Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 1)
            .env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", 600_000)
            .env("SNAKECAGE_POOL__QUEUE_TIMEOUT_MS", 600_000),
    )
    .await
}

/// A stateless run that holds the only slot until it is aborted, once it holds it.
async fn hold_the_slot(s: &Server) -> tokio::task::JoinHandle<Value> {
    let holder = s.spawn_execute(json!({
        "code": "import time\ntime.sleep(300)",
        "timeout_ms": 600_000,
    }));
    eventually(60, "the slot is taken", async || pool(s).await.0 == 1).await;
    holder
}

#[tokio::test]
async fn a_queued_session_run_whose_client_leaves_never_runs_and_frees_the_session() {
    let s = one_slot().await;
    let id = s.new_session().await;
    s.session_run(&id, "x = 1").await;
    for route in ["execute", "execute/stream"] {
        // A stateless run holds the only slot until its own client leaves.
        let holder = hold_the_slot(&s).await;

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

/// Streams `code` to `path` while the only slot is held, waits until it is in the queue and
/// cancels it: its `result`, which comes while the slot is still held (the bound is for a
/// result that never comes; the holder sleeps for minutes).
async fn cancel_in_the_queue<'s>(
    s: &'s Server,
    path: &str,
    code: &str,
) -> (StreamedRun<'s>, Value) {
    let mut run = s.stream(path, &json!({ "code": code })).await;
    eventually(60, "the run waits in the queue", async || {
        pool(s).await.1 == 1
    })
    .await;
    assert_eq!(run.cancel().await, 204);
    let result = tokio::time::timeout(Duration::from_secs(120), run.result())
        .await
        .expect("a run cancelled in the queue is answered while the slot is still held");
    // Neither the slot nor a place in the queue is taken by it.
    assert_eq!(pool(s).await, (1, 0));
    (run, result)
}

const NEVER_STARTED: &str = "The run was cancelled by its client while it waited in the \
                             queue for a slot: it never started, and none of its code ran.";

#[tokio::test]
async fn a_queued_session_run_cancelled_never_runs_and_the_session_is_free_at_once() {
    let s = one_slot().await;
    let id = s.new_session().await;
    s.session_run(&id, "y = 2").await;
    let holder = hold_the_slot(&s).await;
    let path = format!("/v1/sessions/{id}/execute/stream");
    let (run, result) = cancel_in_the_queue(&s, &path, "x = 1\nprint('ran')").await;
    assert_eq!(result["verdict"], "killed", "{result}");
    assert_eq!(result["exit_code"], Value::Null, "{result}");
    assert_eq!(result["timed_out"], false, "{result}");
    assert_eq!(result["stdout"], "", "{result}");
    assert_eq!(
        result["stderr"],
        format!("{NEVER_STARTED} The session's state is untouched."),
        "{result}"
    );
    assert_eq!(result["session"]["names"], json!(["y"]), "{result}");
    assert!(
        run.events_other_than(&["result"]).is_empty(),
        "{:?}",
        run.seen
    );
    // Free at once, the slot still held: listed, not busy.
    let (status, detail) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["status"], "idle", "{detail}");
    assert_eq!(detail["variables_total"], 1, "{detail}");

    holder.abort();
    eventually(60, "the slot is free again", async || pool(&s).await.0 == 0).await;
    let r = s.session_run(&id, "print('x' in globals(), y)").await;
    assert_eq!(r["stdout"], "False 2\n", "the cancelled cell ran: {r}");
}

#[tokio::test]
async fn a_queued_stateless_run_cancelled_never_takes_a_worker() {
    let s = one_slot().await;
    let holder = hold_the_slot(&s).await;
    let checkouts = |health: &Value| -> u64 {
        let tiers = health["pool"]["tiers"].as_array().unwrap();
        tiers.iter().map(|t| t["checkouts"].as_u64().unwrap()).sum()
    };
    let before = checkouts(&s.health().await);
    let (run, result) = cancel_in_the_queue(&s, "/v1/execute/stream", "print('ran')").await;
    assert_eq!(result["verdict"], "killed", "{result}");
    assert_eq!(result["exit_code"], Value::Null, "{result}");
    assert_eq!(result["stdout"], "", "{result}");
    assert_eq!(result["stderr"], NEVER_STARTED, "{result}");
    assert!(
        run.events_other_than(&["result"]).is_empty(),
        "{:?}",
        run.seen
    );
    holder.abort();
    eventually(60, "the slot is free again", async || pool(&s).await.0 == 0).await;
    // No worker was taken for it, before or after the slot was free.
    assert_eq!(checkouts(&s.health().await), before);
}

/// A session deleted while a run of it waits in the queue: the run is answered at once,
/// 410 saying it never started, while the slot is still held, and none of its code runs
/// once the slot is free (before, it ran on the deleted session's worker in about a third
/// of tries, or was told it had been killed in progress, and either way only once a slot
/// came).
#[tokio::test]
async fn a_session_deleted_while_its_run_waits_in_the_queue_answers_at_once_and_never_runs_it() {
    let s = one_slot().await;
    let id = s.new_session().await;
    s.session_run(&id, "y = 2").await;
    let holder = hold_the_slot(&s).await;
    let request = s
        .client
        .post(format!("{}/v1/sessions/{id}/execute", s.base))
        .json(&json!({ "code": "print('ran, après la suppression')" }));
    let queued = tokio::spawn(async move {
        let response = request.send().await.unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().await.unwrap(),
        )
    });
    eventually(60, "the session run waits in the queue", async || {
        pool(&s).await.1 == 1
    })
    .await;
    let deleted = s
        .client
        .delete(format!("{}/v1/sessions/{id}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let (status, body) = tokio::time::timeout(Duration::from_secs(120), queued)
        .await
        .expect("the queued run is answered while the slot is still held")
        .unwrap();
    assert_eq!(status, 410, "{body}");
    assert_eq!(
        body["detail"],
        format!(
            "Session '{id}' was deleted while this run waited for an execution slot; the run \
             never started."
        ),
        "{body}"
    );
    assert_eq!(pool(&s).await, (1, 0));
    let (status, _) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 404);
    holder.abort();
    eventually(60, "the slot is free again", async || pool(&s).await.0 == 0).await;
}
