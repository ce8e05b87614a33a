//! The CPU-time backstop behind the wall-clock deadline (`RLIMIT_CPU`): a stateless
//! worker gets `limits.max_timeout_ms` and a second; a session's worker gets as much for
//! each run, and as much in all for what it does between runs, so a long-lived busy
//! session is not killed for the CPU time its earlier runs used, and a run that burns its
//! own budget is still stopped. Renewing the budget takes CAP_SYS_RESOURCE (in the host's
//! initial user namespace); a service without it says so at `/health`
//! (`sessions.cpu_budget`: `per_life`), and its sessions keep one budget for their life.
//! Each test asserts what its service's `/health` says it does.

use serde_json::{Value, json};

use crate::harness::{Options, Server};

/// `limits.max_timeout_ms` of these tests: a CPU budget of 3 s, the hard limit at 4 s.
const MAX_TIMEOUT_MS: u64 = 2000;
const BUDGET_SECONDS: f64 = 3.0;

async fn server(options: Options) -> Server {
    Server::start_with(options.env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", MAX_TIMEOUT_MS)).await
}

/// Whether the service renews a session's budget for each run (else it has one for its
/// life).
async fn per_run(s: &Server) -> bool {
    let scope = s.health().await["sessions"]["cpu_budget"].clone();
    assert!(scope == "per_run" || scope == "per_life", "{scope}");
    scope == "per_run"
}

/// The reason a session whose worker used up its CPU-time budget is gone for.
fn used_up(per_run: bool) -> &'static str {
    if per_run {
        "its worker used up its CPU time (limits.max_timeout_ms and a second, 3 s, for each \
         run, and as much in all for what it does between runs) and was killed by signal 24 \
         (SIGXCPU)"
    } else {
        "its worker used up its CPU time (limits.max_timeout_ms and a second, 3 s, for the \
         session's whole life: the service lacks CAP_SYS_RESOURCE to renew it for each run) \
         and was killed by signal 24 (SIGXCPU)"
    }
}

async fn run(s: &Server, id: &str, code: &str) -> Value {
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": code, "timeout_ms": MAX_TIMEOUT_MS}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    r
}

/// Spins for up to a second of CPU time, then prints the process's CPU time in all. A
/// host too busy to give it that second before the deadline interrupts it (`timeout`, the
/// state kept), having spent less: the test goes on with the next run.
const SPIN: &str = "t0 = time.process_time()
try:
    while time.process_time() - t0 < 1.0:
        pass
finally:
    print(time.process_time())";

/// Runs `SPIN` in a session until the worker has used twice its CPU budget and more: the
/// responses, and the process's CPU time after the last.
async fn spin_past_two_budgets(s: &Server, id: &str) -> (Vec<Value>, f64) {
    run(s, id, "import time\nx = 1").await;
    let mut responses = Vec::new();
    let mut used = 0.0;
    // However busy the host, each run spends some CPU time; 60 are far more than needed.
    for _ in 0..60 {
        let r = run(s, id, SPIN).await;
        responses.push(r.clone());
        if r["verdict"] != "ok" && r["verdict"] != "timeout" {
            break;
        }
        used = r["stdout"].as_str().unwrap().trim().parse().unwrap();
        if used > 2.0 * BUDGET_SECONDS + 1.0 {
            break;
        }
    }
    (responses, used)
}

#[tokio::test]
async fn a_busy_session_gets_a_cpu_budget_for_each_run_and_keeps_its_state() {
    let s = server(Options::default()).await;
    let per_run = per_run(&s).await;
    let id = s.new_session().await;
    let (responses, used) = spin_past_two_budgets(&s, &id).await;
    let last = responses.last().unwrap();
    if !per_run {
        // One budget for the session's life: a run past it is killed, and says why.
        assert_eq!(last["verdict"], "killed", "{responses:?}");
        assert!(used < BUDGET_SECONDS + 1.0, "{used}: {responses:?}");
        assert!(
            last["notice"].as_str().unwrap().contains(used_up(false)),
            "{last}"
        );
        return;
    }
    assert!(
        used > 2.0 * BUDGET_SECONDS + 1.0,
        "a run was not ok: {last}"
    );
    let r = run(&s, &id, "print(x)").await;
    assert_eq!(r["stdout"], "1\n", "{r}");
}

/// A run that ignores its interrupt and spins on: the grace before the kill is long, the
/// CPU-time limit stops it first. The session is gone, and says why.
#[tokio::test]
async fn a_session_run_that_burns_its_cpu_budget_is_killed_and_the_session_says_why() {
    let s = server(Options::default().env("SNAKECAGE_SESSIONS__INTERRUPT_GRACE_MS", 600_000)).await;
    let per_run = per_run(&s).await;
    let id = s.new_session().await;
    run(&s, &id, "x = 1").await;
    let r = run(
        &s,
        &id,
        "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass",
    )
    .await;
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    let notice = r["notice"].as_str().unwrap();
    assert!(notice.contains(used_up(per_run)), "{r}");
    let (status, detail) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 410, "{detail}");
}

/// A thread a run left spinning burns CPU with no deadline to stop it: all the worker does
/// between runs has one budget for its life, and its session says so once it is spent.
#[tokio::test]
async fn a_thread_spinning_between_runs_has_one_budget_for_the_sessions_life() {
    let s = server(Options::default()).await;
    let per_run = per_run(&s).await;
    let id = s.new_session().await;
    let code = "import os, threading
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
print(os.getpid())";
    let r = run(&s, &id, code).await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let pid: u32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    // No run renews it: the worker dies of its CPU-time limit (bounded wait: 3 s of CPU
    // on however busy a host).
    crate::reliability::eventually(600, "the worker is killed", async || {
        !crate::harness::process_exists(pid)
    })
    .await;
    let (status, detail) = s
        .post(&format!("/v1/sessions/{id}/execute"), &json!({"code": "1"}))
        .await;
    assert_eq!(status, 410, "{detail}");
    let detail = detail["detail"].as_str().unwrap();
    assert!(detail.contains(used_up(per_run)), "{detail}");
}

/// Soft and hard `RLIMIT_CPU` of process `pid`, in seconds.
fn cpu_limit(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max cpu time"))
        .unwrap();
    let mut words = line.split_whitespace().skip(3);
    let soft = words.next().unwrap().parse().unwrap();
    let hard = words.next().unwrap().parse().unwrap();
    (soft, hard)
}

/// Streams `code`, which prints its pid and its process's CPU time so far (and then
/// sleeps), to `path`: the run, the pid and that CPU time.
async fn pid_and_cpu_time<'s>(
    s: &'s Server,
    path: &str,
    code: &str,
) -> (crate::streamed::StreamedRun<'s>, u32, f64) {
    let body = json!({"code": code, "timeout_ms": MAX_TIMEOUT_MS});
    let mut run = s.stream(path, &body).await;
    let out = run.until("output").await;
    let printed = out["data"].as_str().unwrap().to_owned();
    let (pid, cpu) = printed.trim().split_once(' ').unwrap();
    (run, pid.parse().unwrap(), cpu.parse().unwrap())
}

const PRINT_PID_AND_CPU_TIME: &str =
    "import os, time\nprint(os.getpid(), time.process_time(), flush=True)\ntime.sleep(60)";

/// The limits themselves, read from `/proc` while a run runs: a stateless worker's is
/// `limits.max_timeout_ms` and a second (3 s); a session's is as much from its CPU time at
/// the run's start (or, for one budget per life, the same 3 s whatever it used). The hard
/// limit, which no code in the worker may raise, is a second further.
#[tokio::test]
async fn a_workers_cpu_limit_is_its_budget_and_its_hard_limit_a_second_further() {
    let s = server(Options::default()).await;
    let per_run = per_run(&s).await;
    let (mut stateless, pid, _) =
        pid_and_cpu_time(&s, "/v1/execute/stream", PRINT_PID_AND_CPU_TIME).await;
    assert_eq!(cpu_limit(pid), (3, 4));
    assert_eq!(stateless.cancel().await, 204);
    stateless.result().await;

    let id = s.new_session().await;
    let path = format!("/v1/sessions/{id}/execute/stream");
    for _ in 0..3 {
        let (mut running, pid, cpu) = pid_and_cpu_time(&s, &path, PRINT_PID_AND_CPU_TIME).await;
        let (soft, hard) = cpu_limit(pid);
        assert_eq!(hard, soft + 1);
        if per_run {
            // From its start: the CPU time before it, rounded up, and a budget; the run's
            // own start (before its print) is a few milliseconds at most.
            let from = soft as f64 - BUDGET_SECONDS;
            assert!(cpu - 0.5 < from && from < cpu + 1.0, "{soft} {cpu}");
        } else {
            assert_eq!((soft, hard), (3, 4));
        }
        assert_eq!(running.cancel().await, 204);
        running.result().await;
        if per_run {
            // Past the budget a worker starts with.
            let r = run(&s, &id, &format!("import time\n{SPIN}")).await;
            assert!(r["verdict"] == "ok" || r["verdict"] == "timeout", "{r}");
        }
    }
}
