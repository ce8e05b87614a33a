//! `/v1/sessions`: state that persists, reset, variables, timeouts, lost workers (410),
//! expiry, eviction, isolation and cleanup.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Options, Server, process_exists, variable_names};
use crate::reliability::eventually;
use crate::stream::stream;

pub(crate) async fn create(s: &Server, body: Value) -> String {
    let (status, r) = s.post("/v1/sessions", &body).await;
    assert_eq!(status, 201, "{r}");
    assert!(r["expires_at"].as_str().unwrap().ends_with('Z'), "{r}");
    r["session_id"].as_str().unwrap().to_owned()
}

pub(crate) async fn exec(s: &Server, id: &str, body: Value) -> (u16, Value) {
    s.post(&format!("/v1/sessions/{id}/execute"), &body).await
}

pub(crate) async fn run(s: &Server, id: &str, code: &str) -> Value {
    let (status, r) = exec(s, id, json!({ "code": code })).await;
    assert_eq!(status, 200, "{r}");
    r
}

pub(crate) async fn get(s: &Server, path: &str) -> (u16, Value) {
    let resp = s
        .client
        .get(format!("{}{path}", s.base))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    if status >= 400 {
        crate::harness::check_error_body(status, &body);
    }
    (status, body)
}

async fn delete(s: &Server, path: &str) -> u16 {
    s.client
        .delete(format!("{}{path}", s.base))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn globals_imports_and_files_persist_across_calls() {
    let s = Server::start().await;
    let id = create(&s, json!({ "ttl_seconds": 900 })).await;
    run(
        &s,
        &id,
        "import math\nx = 42\nopen('notes.txt', 'w').write('hi')",
    )
    .await;
    let r = run(
        &s,
        &id,
        "print(x)\nprint(open('notes.txt').read())\nmath.sqrt(x * x)",
    )
    .await;
    assert_eq!(r["stdout"], "42\nhi\n42.0\n");
    assert_eq!(r["results"], json!([{"text/plain": "42.0"}]));
    // Every session run says what the session holds, for a chat UI to show.
    assert_eq!(r["session"]["variables"], 2, "{r}");
    assert_eq!(r["session"]["names"], json!(["math", "x"]), "{r}");
    assert!(
        r["session"]["expires_at"]
            .as_str()
            .unwrap()
            .starts_with("20"),
        "{r}"
    );
    // Files are reported once, when new or changed.
    assert_eq!(r["files"], json!([]));
    let r = run(&s, &id, "open('notes.txt', 'a').write('!')").await;
    assert_eq!(r["files"][0]["path"], "notes.txt", "{r}");

    let (status, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["session_id"], id.as_str());
    assert_eq!(info["execution_count"], 3);
    for key in ["created_at", "last_used_at", "expires_at"] {
        assert!(info[key].is_string(), "{key}: {info}");
    }
    let vars = info["variables"].as_array().unwrap();
    let x = vars.iter().find(|v| v["name"] == "x").unwrap();
    assert_eq!(x, &json!({"name": "x", "type": "int", "repr": "42"}));

    let (status, list) = get(&s, "/v1/sessions").await;
    assert_eq!(status, 200);
    assert_eq!(list["sessions"][0]["session_id"], id.as_str());
}

#[tokio::test]
async fn a_session_read_while_it_runs_says_busy_without_its_variables() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    run(&s, &id, "mot = 'gardé ✓'").await;
    let slow = {
        let req = s
            .client
            .post(format!("{}/v1/sessions/{id}/execute", s.base))
            .json(
                &json!({ "code": "import time\ntime.sleep(2)\nencore = 1", "timeout_ms": 30_000 }),
            );
        tokio::spawn(req.send())
    };
    // Wait (on the list, which never holds a session) until the run holds it; a read of
    // the session itself that held it at the moment the run asked would make the run 409.
    eventually(30, "the run holds the session", async || {
        get(&s, "/v1/sessions").await.1["sessions"][0]["status"] == "busy"
    })
    .await;
    let (status, busy) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{busy}");
    assert_eq!(busy["status"], "busy", "{busy}");
    assert_eq!(busy["session_id"], id, "{busy}");
    assert_eq!(busy["variables"], Value::Null, "{busy}");
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.status(), 200);
    let slow: Value = slow.json().await.unwrap();
    assert_eq!(slow["verdict"], "ok", "{slow}");
    let (status, info) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["status"], "idle", "{info}");
    assert_eq!(variable_names(&info), ["mot", "time", "encore"], "{info}");
}

/// Code that leaves three globals and prints its worker's pid.
const PID_AND_NAMES: &str = "import os\npid = os.getpid()\nmot_é = 'gardé'\nprint(pid)";

/// The globals `PID_AND_NAMES` leaves.
const SLOW_NAMES: [&str; 3] = ["os", "pid", "mot_é"];

/// How long a stalled read holds the session.
const STALL: Duration = Duration::from_secs(3);

/// A request sent this long after a stalled read of the session reaches it while the
/// read holds it.
const INTO_THE_READ: Duration = Duration::from_secs(1);

/// Between two stalled reads.
const BETWEEN_READS: Duration = Duration::from_secs(1);

/// `GET path` (a session) while the session's worker is stopped for `STALL`: the read
/// holds the session that long, as a listing stuck in a value would (a listing of Python
/// code is bounded by the runner's own timer; one stuck where no signal handler runs
/// only by the supervisor's interrupt).
async fn stalled_read(s: &Server, path: &str, worker: i32) -> (u16, Value) {
    let pid = nix::unistd::Pid::from_raw(worker);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let (read, ()) = tokio::join!(get(s, path), async {
        tokio::time::sleep(STALL).await;
        // Gone already when the phase deleted the session (a stopped process still dies).
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    });
    read
}

#[tokio::test]
async fn a_run_or_a_read_waits_for_a_read_in_progress_instead_of_failing() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let r = run(&s, &id, PID_AND_NAMES).await;
    assert_eq!(r["session"]["names"], json!(SLOW_NAMES), "{r}");
    let worker: i32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    let path = format!("/v1/sessions/{id}");

    tokio::time::sleep(BETWEEN_READS).await;
    // A second read waits for the first and lists the variables too: the worker is not
    // busy with a run, so "busy" with no variables would be wrong.
    let (first, second) = tokio::join!(stalled_read(&s, &path, worker), async {
        tokio::time::sleep(INTO_THE_READ).await;
        get(&s, &path).await
    });
    for (status, info) in [first, second] {
        assert_eq!(status, 200, "{info}");
        assert_eq!(info["status"], "idle", "{info}");
        assert_eq!(variable_names(&info), SLOW_NAMES, "{info}");
    }

    tokio::time::sleep(BETWEEN_READS).await;
    // A run that arrives during a read waits for it; before, it was refused with 409.
    let (read, ran) = tokio::join!(stalled_read(&s, &path, worker), async {
        tokio::time::sleep(INTO_THE_READ).await;
        exec(
            &s,
            &id,
            json!({ "code": "print('après ✓')", "timeout_ms": 30_000 }),
        )
        .await
    });
    assert_eq!(read.0, 200, "{}", read.1);
    assert_eq!(variable_names(&read.1), SLOW_NAMES, "{}", read.1);
    assert_eq!(ran.0, 200, "{}", ran.1);
    assert_eq!(ran.1["stdout"], "après ✓\n", "{}", ran.1);

    tokio::time::sleep(BETWEEN_READS).await;
    // Two runs still do not share the session: the second is refused while the first
    // waits for a read.
    let (read, first, second) = tokio::join!(
        stalled_read(&s, &path, worker),
        async {
            tokio::time::sleep(INTO_THE_READ).await;
            exec(&s, &id, json!({ "code": "un = 1", "timeout_ms": 30_000 })).await
        },
        async {
            tokio::time::sleep(INTO_THE_READ * 2).await;
            exec(&s, &id, json!({ "code": "deux = 2" })).await
        }
    );
    assert_eq!(read.0, 200, "{}", read.1);
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(second.0, 409, "{}", second.1);
    assert_eq!(second.1["code"], "session_busy", "{}", second.1);

    tokio::time::sleep(BETWEEN_READS).await;
    // A run whose client goes away while it waits for a read gives up its claim: the
    // next run is served, not refused as busy.
    let (read, abandoned) = tokio::join!(stalled_read(&s, &path, worker), async {
        tokio::time::sleep(INTO_THE_READ).await;
        s.client
            .post(format!("{}/v1/sessions/{id}/execute", s.base))
            .json(&json!({ "code": "abandonné = 1" }))
            .timeout(Duration::from_millis(500))
            .send()
            .await
    });
    assert_eq!(read.0, 200, "{}", read.1);
    let abandoned = abandoned.expect_err("the client gave up before the read ended");
    assert!(abandoned.is_timeout(), "{abandoned}");
    let r = run(&s, &id, "print('servi', 'abandonné' in globals())").await;
    assert_eq!(r["stdout"], "servi False\n", "{r}");

    tokio::time::sleep(BETWEEN_READS).await;
    // A session deleted while a run waits for a read: the run is told it is gone.
    let (_, waited, deleted) = tokio::join!(
        stalled_read(&s, &path, worker),
        async {
            tokio::time::sleep(INTO_THE_READ).await;
            exec(
                &s,
                &id,
                json!({ "code": "print('trop tard')", "timeout_ms": 30_000 }),
            )
            .await
        },
        async {
            tokio::time::sleep(INTO_THE_READ * 2).await;
            delete(&s, &path).await
        }
    );
    assert_eq!(deleted, 204);
    assert_eq!(waited.0, 410, "{}", waited.1);
    assert_eq!(waited.1["code"], "session_gone", "{}", waited.1);
    assert!(
        waited.1["detail"]
            .as_str()
            .unwrap()
            .contains("while this request waited"),
        "{}",
        waited.1
    );
}

#[tokio::test]
async fn reset_clears_globals_and_keeps_the_session() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    run(&s, &id, "x = 1").await;
    let (status, _) = s
        .post(&format!("/v1/sessions/{id}/reset"), &json!({}))
        .await;
    assert_eq!(status, 200);
    let r = run(&s, &id, "print('x' in globals())").await;
    assert_eq!(r["stdout"], "False\n");
}

/// In a new session on `s`: `x = 'gardé'`, then `code`, which must still be running at its
/// 500 ms deadline and be interrupted there (`KeyboardInterrupt`, no exit code), the
/// session living on. Returns the session, for what `code` set before the deadline.
async fn a_deadline_interrupts(s: &Server, code: &str) -> String {
    let id = create(s, json!({})).await;
    run(s, &id, "x = 'gardé'").await;
    let (status, r) = exec(s, &id, json!({ "code": code, "timeout_ms": 500 })).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["exit_code"], Value::Null, "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("KeyboardInterrupt"),
        "{r}"
    );
    id
}

#[tokio::test]
async fn a_timeout_interrupts_the_run_and_keeps_earlier_state() {
    let s = Server::start().await;
    let id = a_deadline_interrupts(&s, "y = 1\nwhile True: pass").await;
    let r = run(&s, &id, "print(x, y)").await;
    assert_eq!(r["stdout"], "gardé 1\n", "{r}");
}

/// A service started with SIGINT ignored (in a shell's background, by a launcher that
/// ignores it: the disposition is inherited across exec, and CPython leaves an ignored
/// SIGINT alone) still interrupts a session's overdue job instead of losing the session.
#[tokio::test]
async fn a_service_started_with_sigint_ignored_still_interrupts_a_sessions_job() {
    let s = Server::start_with(Options::default().wrapper(&[
        "bash",
        "-c",
        r#"trap '' INT; "$0" "$@"; exit $?"#,
    ]))
    .await;
    let code = "import time\nprint('busy', flush=True)\ntime.sleep(30)";
    let id = a_deadline_interrupts(&s, code).await;
    let r = run(&s, &id, "print(x)").await;
    assert_eq!(r["stdout"], "gardé\n", "{r}");
}

#[tokio::test]
async fn a_session_whose_idle_worker_is_killed_says_how_it_died() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let r = run(&s, &id, "import os\nprint(os.getpid())\nmot = 'perdu ✗'").await;
    let pid: i32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually(30, "the worker is gone", async || {
        !process_exists(pid as u32)
    })
    .await;
    // Before: "i/o error on the frame stream: Broken pipe (os error 32)".
    let (status, r) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 410, "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(detail.contains("killed by signal 9"), "{r}");
    assert!(!detail.contains("frame stream"), "{r}");
    let (status, r) = exec(&s, &id, json!({ "code": "print(mot)" })).await;
    assert_eq!(status, 410, "{r}");
    assert!(
        r["detail"].as_str().unwrap().contains("killed by signal 9"),
        "{r}"
    );
}

#[tokio::test]
async fn a_session_whose_job_closes_its_job_socket_says_that_is_what_killed_it() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    run(&s, &id, "x = 1").await;
    // The worker's job socket is fd 3: closing it loses the worker. Before, the notice said
    // only "its worker was killed by signal 9".
    let r = run(&s, &id, "import os, time\nos.close(3)\ntime.sleep(1)").await;
    let notice = r["notice"]
        .as_str()
        .unwrap_or_else(|| panic!("no notice: {r}"));
    assert!(notice.contains("The session is gone"), "{r}");
    assert!(notice.contains("job socket"), "{r}");
    assert!(notice.contains("fd 3"), "{r}");
    let (status, r) = exec(&s, &id, json!({ "code": "print(x)" })).await;
    assert_eq!(status, 410, "{r}");
    assert!(r["detail"].as_str().unwrap().contains("job socket"), "{r}");
}

#[tokio::test]
async fn a_session_whose_worker_is_killed_answers_410() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SESSIONS__INTERRUPT_GRACE_MS", 500))
            .await;
    let id = create(&s, json!({})).await;
    run(&s, &id, "x = 1").await;
    // Swallows every KeyboardInterrupt: only a kill stops it.
    let stubborn = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass";
    let (status, r) = exec(&s, &id, json!({ "code": stubborn, "timeout_ms": 300 })).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["timed_out"], true);
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("The session is gone"),
        "{r}"
    );
    let (status, r) = exec(&s, &id, json!({ "code": "print(x)" })).await;
    assert_eq!(status, 410, "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains("is gone")
            && detail.contains("create a new session")
            && detail.contains(
                "its worker did not stop within 500 ms of being interrupted at the 300 ms \
                 deadline and was killed"
            ),
        "{detail}"
    );
    assert_eq!(get(&s, &format!("/v1/sessions/{id}")).await.0, 410);
    let m = s.scrape().await;
    assert_eq!(m.get("snakecage_sessions_lost_total", &[]), 1.0);
    assert_eq!(m.get("snakecage_sessions_active", &[]), 0.0);
    assert_eq!(
        m.get(
            "snakecage_executions_total",
            &[("kind", "session"), ("outcome", "timeout")]
        ),
        1.0
    );
    // Deleting it forgets it: 204 once, then 404; it is not counted a second time.
    assert_eq!(delete(&s, &format!("/v1/sessions/{id}")).await, 204);
    assert_eq!(delete(&s, &format!("/v1/sessions/{id}")).await, 404);
    let m = s.scrape().await;
    assert_eq!(m.get("snakecage_sessions_closed_total", &[]), 0.0);
    assert_eq!(m.get("snakecage_sessions_active", &[]), 0.0);
}

/// A stubborn run its client cancels (`DELETE /v1/runs/{id}`) long before its deadline:
/// the worker is killed after the grace, and the session's reason names the cancel, not
/// a deadline that never came.
#[tokio::test]
async fn a_session_whose_worker_ignores_its_clients_cancel_says_so_in_its_410() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SESSIONS__INTERRUPT_GRACE_MS", 500))
            .await;
    let id = create(&s, json!({})).await;
    let stubborn = "import time\nprint('commencé', flush=True)\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass";
    let mut stream = s
        .stream(
            &format!("/v1/sessions/{id}/execute/stream"),
            &json!({ "code": stubborn, "timeout_ms": 60_000 }),
        )
        .await;
    let r = stream.cancel_when(|event, _| event == "output").await;
    let why = "its worker did not stop within 500 ms of being interrupted when its client \
               cancelled the run and was killed";
    assert!(r["stderr"].as_str().unwrap().contains(why), "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    let (status, r) = exec(&s, &id, json!({ "code": "1" })).await;
    assert_eq!(status, 410, "{r}");
    assert!(r["detail"].as_str().unwrap().contains(why), "{r}");
}

#[tokio::test]
async fn session_lifecycle_is_counted_in_the_metrics() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let m = s.scrape().await;
    assert_eq!(m.get("snakecage_sessions_created_total", &[]), 1.0);
    assert_eq!(m.get("snakecage_sessions_active", &[]), 1.0);
    run(&s, &id, "x = 1").await;
    run(&s, &id, "1 / 0").await;
    assert_eq!(delete(&s, &format!("/v1/sessions/{id}")).await, 204);
    let m = s.scrape().await;
    assert_eq!(
        m.get(
            "snakecage_executions_total",
            &[("kind", "session"), ("outcome", "ok")]
        ),
        1.0
    );
    assert_eq!(
        m.get(
            "snakecage_executions_total",
            &[("kind", "session"), ("outcome", "error")]
        ),
        1.0
    );
    assert_eq!(m.get("snakecage_sessions_closed_total", &[]), 1.0);
    assert_eq!(m.get("snakecage_sessions_active", &[]), 0.0);
}

#[tokio::test]
async fn idle_sessions_expire_and_the_least_recently_used_is_evicted() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_SESSIONS__IDLE_TIMEOUT_SECONDS", 2)
            .env("SNAKECAGE_SESSIONS__MAX_SESSIONS", 2),
    )
    .await;
    let short = create(&s, json!({ "ttl_seconds": 1 })).await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let (status, r) = exec(&s, &short, json!({ "code": "1" })).await;
    assert_eq!(status, 410, "{r}");
    assert!(r["detail"].as_str().unwrap().contains("expired"), "{r}");

    let a = create(&s, json!({})).await;
    let b = create(&s, json!({})).await;
    run(&s, &a, "v = 'a'").await; // b is now the least recently used
    let c = create(&s, json!({})).await;
    let (status, r) = exec(&s, &b, json!({ "code": "1" })).await;
    assert_eq!(status, 410, "{r}");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("least recently used"),
        "{r}"
    );
    assert_eq!(run(&s, &a, "print(v)").await["stdout"], "a\n");
    run(&s, &c, "1").await;
}

#[tokio::test]
async fn twenty_concurrent_sessions_do_not_see_each_other() {
    let s = Server::start().await;
    let ids = futures_util::future::join_all((0..20).map(|_| create(&s, json!({})))).await;
    futures_util::future::join_all(
        ids.iter()
            .enumerate()
            .map(|(i, id)| run(&s, id, Box::leak(format!("secret = {i}").into_boxed_str()))),
    )
    .await;
    let outs = futures_util::future::join_all(ids.iter().map(|id| {
        run(
            &s,
            id,
            "print(secret, len([k for k in globals() if k == 'secret']))",
        )
    }))
    .await;
    for (i, r) in outs.iter().enumerate() {
        assert_eq!(r["stdout"], format!("{i} 1\n"), "{r}");
    }
    // Stateless traffic still flows with twenty sessions alive.
    assert_eq!(s.run("print('free')").await["stdout"], "free\n");
}

#[tokio::test]
async fn deleting_a_session_kills_its_worker_and_frees_the_pool() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let pid: u32 = run(&s, &id, "import os\nprint(os.getpid())").await["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(process_exists(pid));
    assert_eq!(s.health().await["sessions"]["active"], 1);
    assert_eq!(delete(&s, &format!("/v1/sessions/{id}")).await, 204);
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_exists(pid) {
        assert!(
            Instant::now() < deadline,
            "session worker {pid} outlived its session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.health().await["sessions"]["active"], 0);
    s.wait_for_idle(2).await;
    assert_eq!(delete(&s, &format!("/v1/sessions/{id}")).await, 404);
    assert_eq!(exec(&s, &id, json!({ "code": "1" })).await.0, 404);
    assert_eq!(delete(&s, "/v1/sessions/sess_unknown").await, 404);
}

#[tokio::test]
async fn a_session_streams_and_bash_is_not_available() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    run(&s, &id, "x = 5").await;
    let events = stream(
        &s,
        &format!("/v1/sessions/{id}/execute/stream"),
        json!({ "code": "print(x * 2)" }),
    )
    .await;
    assert_eq!(events[0].data, json!({"stream": "stdout", "data": "10\n"}));
    assert_eq!(events.last().unwrap().event, "result");
    assert_eq!(events.last().unwrap().data["exit_code"], 0);

    let (status, r) = s
        .post(
            &format!("/v1/sessions/{id}/bash"),
            &json!({ "command": "ls" }),
        )
        .await;
    assert_eq!(status, 501, "{r}");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("cannot spawn processes"),
        "{r}"
    );

    let (status, r) = s
        .post("/v1/sessions", &json!({ "ttl_seconds": 86_401 }))
        .await;
    assert_eq!(status, 422, "{r}");
}

/// Runs `print(x)` in session `id` once its interrupted run has finished (409 until then).
async fn x_once_idle(s: &Server, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, r) = exec(s, id, json!({ "code": "print(x)" })).await;
        if status != 409 {
            assert_eq!(status, 200, "the session was lost: {r}");
            return r;
        }
        assert!(Instant::now() < deadline, "still busy: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until session `id` is running a job.
async fn wait_busy(s: &Server, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, listed) = get(s, "/v1/sessions").await;
        let busy = listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["session_id"] == id && x["status"] == "busy");
        if busy {
            return;
        }
        assert!(Instant::now() < deadline, "{listed}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client whose HTTP timeout is shorter than its run goes away mid-run: the run is
/// interrupted as at its deadline and the session keeps its state, streamed or not.
#[tokio::test]
async fn a_client_that_disconnects_mid_run_interrupts_it_and_the_session_keeps_its_state() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    run(&s, &id, "x = 5").await;
    let slow = json!({ "code": "import time\nprint('started', flush=True)\ntime.sleep(30)\nx = 6", "timeout_ms": 60000 });

    let request = s
        .client
        .post(format!("{}/v1/sessions/{id}/execute", s.base))
        .json(&slow);
    let pending = tokio::spawn(request.send());
    wait_busy(&s, &id).await;
    pending.abort();
    let r = x_once_idle(&s, &id).await;
    assert_eq!(r["stdout"], "5\n", "{r}");
    let (status, detail) = get(&s, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["status"], "idle", "{detail}");

    let resp = s
        .client
        .post(format!("{}/v1/sessions/{id}/execute/stream", s.base))
        .json(&slow)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = crate::stream::read_events(resp, Instant::now(), |e| e.event == "output").await;
    assert_eq!(events.last().unwrap().event, "output", "{events:?}");
    let r = x_once_idle(&s, &id).await;
    assert_eq!(r["stdout"], "5\n", "{r}");
}

/// A session reports what it cannot store (a link, a name that is not UTF-8) once, like
/// the files it stores, and again only when it is replaced: not in every later response.
#[tokio::test]
async fn a_session_reports_an_unstorable_entry_once_and_again_only_when_replaced() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let skipped = |r: &Value| -> Vec<String> {
        r["skipped_files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_owned())
            .collect()
    };
    let r = run(
        &s,
        &id,
        "import os\nos.symlink('/etc/passwd', 'link')\nopen(b'bad\\xff.txt', 'w').write('x')",
    )
    .await;
    let mut first = skipped(&r);
    first.sort();
    assert_eq!(first, ["bad\u{fffd}.txt", "link"], "{r}");

    let r = run(&s, &id, "print(1)").await;
    assert_eq!(r["stdout"], "1\n", "{r}");
    assert!(skipped(&r).is_empty(), "reported again: {r}");

    let r = run(
        &s,
        &id,
        "import os\nos.remove('link')\nos.symlink('/etc/hosts', 'link')",
    )
    .await;
    assert_eq!(skipped(&r), ["link"], "the replaced link is new: {r}");
}

#[tokio::test]
async fn a_link_the_session_made_in_the_way_of_a_staged_file_is_named() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let up = crate::files::upload(&s, "entrée.csv", b"a\n1\n".to_vec()).await;
    let r = run(&s, &id, "import os\nos.symlink('/etc', 'données')").await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let files = json!([{"path": "données/entrée.csv", "file_id": up["file_id"]}]);
    let (status, r) = exec(&s, &id, json!({ "code": "print(1)", "files": files })).await;
    assert_eq!(status, 422, "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains("données/entrée.csv") && detail.contains("symbolic link"),
        "{r}"
    );
    // Nothing was written through the link.
    assert!(!std::path::Path::new("/etc/entrée.csv").exists());
}

/// A thread a run leaves behind goes on between runs, as in a notebook: it does not wait
/// for the next run to be scheduled again.
#[tokio::test]
async fn a_thread_a_run_left_goes_on_between_runs() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let r = run(
        &s,
        &id,
        "import threading, time\n\
         marques = []\n\
         def later():\n    for _ in range(20):\n        time.sleep(0.02)\n        marques.append(time.monotonic())\n\
         threading.Thread(target=later).start()",
    )
    .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    // The thread's 20 marks take 0.4 s. Frozen between runs, it would take at most one
    // (as the next run starts, before its first line) where it now takes all 20.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = run(
        &s,
        &id,
        "début = time.monotonic()\nprint(sum(m < début for m in marques))",
    )
    .await;
    assert_eq!(r["stdout"], "20\n", "{r}");
}

#[tokio::test]
async fn tools_declared_on_a_sessions_plain_execute_are_sent_to_its_own_stream() {
    let s = Server::start().await;
    let id = create(&s, json!({})).await;
    let tools = json!([{"name": "lookup", "description": "Looks up.",
                        "parameters": {"type": "object"}}]);
    let (status, r) = exec(&s, &id, json!({"code": "1", "tools": tools})).await;
    assert_eq!(status, 422, "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("POST /v1/sessions/{id}/execute/stream,")),
        "{detail}"
    );
    assert!(!detail.contains("/v1/execute/stream"), "{detail}");
    // The session is untouched and runs on.
    assert_eq!(run(&s, &id, "print(2)").await["stdout"], "2\n");
}
