//! Session recovery (`"replay": true`): a lost worker is rebuilt by replaying the session's
//! successful runs before the next run, and the caller is told; failed runs are not
//! replayed; a replay that fails leaves the session 410 with the reason; default off.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::harness::{Options, Server, process_exists};

async fn create(s: &Server, body: Value) -> String {
    let (status, r) = s.post("/v1/sessions", &body).await;
    assert_eq!(status, 201, "{r}");
    r["session_id"].as_str().unwrap().to_owned()
}

async fn exec(s: &Server, id: &str, code: &str) -> (u16, Value) {
    s.post(
        &format!("/v1/sessions/{id}/execute"),
        &json!({ "code": code }),
    )
    .await
}

async fn run(s: &Server, id: &str, code: &str) -> Value {
    let (status, r) = exec(s, id, code).await;
    assert_eq!(status, 200, "{r}");
    r
}

/// The session's worker pid (workers share the host's pid namespace).
pub async fn worker_pid(s: &Server, id: &str) -> i32 {
    let r = run(s, id, "import os as _os\nprint(_os.getpid())").await;
    r["stdout"].as_str().unwrap().trim().parse().unwrap()
}

/// SIGKILLs a session's worker from outside (user code cannot signal itself) and waits
/// until it is gone: reaped, not only a zombie. A worker with threads (a tool-call pool)
/// is a zombie as soon as its main thread has exited, while its other threads may still
/// hold its job socket open; a job sent then is lost in the socket (the supervisor reads
/// a reset connection), which is not the race these tests are about.
pub async fn kill_worker(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_exists(pid as u32) || std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "worker {pid} survived SIGKILL");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_killed_worker_is_rebuilt_by_replay_and_the_caller_is_told() {
    let s = Server::start().await;
    let file = crate::files::upload(&s, "données.txt", "héllo wörld".as_bytes().to_vec()).await;
    let (status, created) = s
        .post(
            "/v1/sessions",
            &json!({"replay": true, "files": [{"path": "in/données.txt", "file_id": file["file_id"]}]}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["replay"], true);
    let id = created["session_id"].as_str().unwrap().to_owned();

    let r = run(&s, &id, "import numpy as np\nx = 41\nv = np.arange(3)").await;
    assert_eq!(r["session"]["variables"], 3, "{r}");
    let r = run(
        &s,
        &id,
        "x += 1\nopen('out.txt', 'w').write(open('in/données.txt').read().upper())",
    )
    .await;
    assert_eq!(r["files"][0]["path"], "out.txt", "{r}");
    // A failed run is not replayed: its partial effect (y) does not come back.
    let (_, r) = exec(&s, &id, "y = 1\nraise ValueError('nope')").await;
    assert_eq!(r["exit_code"], 1);
    let pid = worker_pid(&s, &id).await;
    kill_worker(pid).await;

    let r = run(
        &s,
        &id,
        "print(x, v.sum(), open('out.txt').read(), 'y' in globals())",
    )
    .await;
    assert_eq!(r["stdout"], "42 3 HÉLLO WÖRLD False\n", "{r}");
    // Three successful runs before the kill (the pid probe is one).
    assert_eq!(r["replayed"], 3, "{r}");
    let notice = r["notice"].as_str().unwrap();
    assert!(
        notice.contains("replayed the session's 3 successful runs"),
        "{notice}"
    );
    // What the replay wrote again is not reported as new.
    assert_eq!(r["files"], json!([]), "{r}");
    assert_ne!(worker_pid(&s, &id).await, pid);
    // Told once: the next run is an ordinary one.
    let r = run(&s, &id, "print(x)").await;
    assert!(
        r.get("replayed").is_none() && r.get("notice").is_none(),
        "{r}"
    );
    assert_eq!(r["stdout"], "42\n");
}

#[tokio::test]
async fn a_worker_lost_mid_run_is_rebuilt_before_the_next_run() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SESSIONS__INTERRUPT_GRACE_MS", 300))
            .await;
    let id = create(&s, json!({"replay": true})).await;
    run(&s, &id, "x = 'ünïcode'").await;
    // Swallows every KeyboardInterrupt: only a kill stops it.
    let stubborn = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass";
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": stubborn, "timeout_ms": 300}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["timed_out"], true);
    let notice = r["notice"].as_str().unwrap();
    assert!(
        notice.contains("will be replayed on a new worker before its next run"),
        "{notice}"
    );
    let (status, info) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["status"], "replay_pending", "{info}");
    // Its variables are unknown until the replay restores them, not none.
    assert_eq!(info["variables"], Value::Null, "{info}");
    assert_eq!(info["variables_total"], Value::Null, "{info}");

    let r = run(&s, &id, "print(x)").await;
    assert_eq!(r["stdout"], "ünïcode\n", "{r}");
    assert_eq!(r["replayed"], 1, "{r}");
    let (_, info) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(info["status"], "idle", "{info}");
    assert_eq!(info["variables"][0]["name"], "x", "{info}");
}

#[tokio::test]
async fn a_replay_that_fails_leaves_the_session_gone_with_the_reason() {
    let s = Server::start().await;
    // A run that succeeds only the first time.
    let id = create(&s, json!({"replay": true})).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    run(
        &s,
        &id,
        &format!(
            "import time\nassert time.time() < {}, 'too late'",
            now + 1.0
        ),
    )
    .await;
    let pid = worker_pid(&s, &id).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    kill_worker(pid).await;
    let (status, r) = exec(&s, &id, "print(1)").await;
    assert_eq!(status, 410, "{r}");
    assert_eq!(r["code"], "session_gone");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains("replaying run 1 of 2 failed")
            && detail.contains("AssertionError: too late"),
        "{detail}"
    );
    let (status, r) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 410, "{r}");

    // A staged file deleted from the store since: the replay says which.
    let file = crate::files::upload(&s, "a.csv", b"1,2\n".to_vec()).await;
    let file_id = file["file_id"].as_str().unwrap();
    let id = create(
        &s,
        json!({"replay": true, "files": [{"path": "a.csv", "file_id": file_id}]}),
    )
    .await;
    let pid = worker_pid(&s, &id).await;
    let resp = s
        .client
        .delete(format!("{}/v1/files/{file_id}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    kill_worker(pid).await;
    let (status, r) = exec(&s, &id, "print(1)").await;
    assert_eq!(status, 410, "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains("staging files") && detail.contains(file_id),
        "{detail}"
    );
}

#[tokio::test]
async fn replay_is_off_by_default_and_ends_past_its_bounds() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SESSIONS__REPLAY_MAX_RUNS", 2)).await;
    // Default: no replay, a lost worker is final.
    let id = create(&s, json!({})).await;
    run(&s, &id, "x = 1").await;
    let pid = worker_pid(&s, &id).await;
    kill_worker(pid).await;
    let (status, r) = exec(&s, &id, "print(x)").await;
    assert_eq!(status, 410, "{r}");

    // Past replay_max_runs the caller is told, and a later loss is final.
    let id = create(&s, json!({"replay": true})).await;
    let r = run(&s, &id, "x = 1").await;
    assert!(r.get("notice").is_none(), "{r}");
    let pid = worker_pid(&s, &id).await;
    let r = run(&s, &id, "x = 2").await;
    let notice = r["notice"].as_str().unwrap();
    assert!(
        notice.contains("can no longer be replayed") && notice.contains("replay_max_runs"),
        "{notice}"
    );
    kill_worker(pid).await;
    let (status, r) = exec(&s, &id, "print(x)").await;
    assert_eq!(status, 410, "{r}");
    assert!(
        r["detail"].as_str().unwrap().contains("2 successful runs"),
        "{r}"
    );
}
