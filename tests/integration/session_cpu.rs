//! The CPU-time backstop behind the wall-clock deadline: a stateless worker gets
//! `limits.max_timeout_ms` and a second (its `RLIMIT_CPU`); a session's worker gets as much
//! for each run, and as much in all for what it does between runs, so a long-lived busy
//! session is not killed for the CPU time its earlier runs used, and a run (or a thread)
//! that burns its own budget is still stopped. With CAP_SYS_RESOURCE the kernel enforces
//! it (the service moves the worker's `RLIMIT_CPU` around each run); without it, as on a
//! container that drops it, the service's watchdog does, and the kernel's limit of a
//! session's worker is `limits.max_session_cpu_seconds` for its whole life. Each test
//! asserts what its service's `/health` says it does.

use serde_json::{Value, json};

use crate::harness::{Options, Server};

/// `limits.max_timeout_ms` of these tests: a CPU budget of 3 s, the hard limit at 4 s.
const MAX_TIMEOUT_MS: u64 = 2000;
const BUDGET_SECONDS: f64 = 3.0;

async fn server(options: Options) -> Server {
    Server::start_with(options.env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", MAX_TIMEOUT_MS)).await
}

/// Whether the service's watchdog enforces a session's budget for each run (else the
/// kernel does).
async fn watchdog(s: &Server) -> bool {
    let sessions = s.health().await["sessions"].clone();
    assert_eq!(sessions["cpu_budget"], "per_run", "{sessions}");
    let by = &sessions["cpu_budget_enforced_by"];
    assert!(by == "kernel" || by == "watchdog", "{sessions}");
    by == "watchdog"
}

/// The reason a session whose worker used up a run's budget is gone for.
fn run_used_up(watchdog: bool) -> String {
    format!(
        "its worker used up its CPU time for one request (3 s: limits.max_timeout_ms and a \
         second) and {}",
        killed_by(watchdog)
    )
}

/// The reason a session whose worker used up its budget between runs is gone for.
fn between_used_up(watchdog: bool) -> String {
    format!(
        "its worker used up its CPU time between requests (3 s in all: limits.max_timeout_ms \
         and a second; threads a run left running use it) and {}",
        killed_by(watchdog)
    )
}

fn killed_by(watchdog: bool) -> &'static str {
    if watchdog {
        "the service killed it (SIGKILL)"
    } else {
        "was killed by signal 24 (SIGXCPU)"
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

/// Runs `SPIN` in a session until the worker has used `total` seconds of CPU time, or a
/// run is neither ok nor timed out: the responses, and the process's CPU time after the
/// last that printed it.
async fn spin_until(s: &Server, id: &str, total: f64) -> (Vec<Value>, f64) {
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
        if used > total {
            break;
        }
    }
    (responses, used)
}

#[tokio::test]
async fn a_busy_session_gets_a_cpu_budget_for_each_run_and_keeps_its_state() {
    let s = server(Options::default()).await;
    watchdog(&s).await;
    let id = s.new_session().await;
    let (responses, used) = spin_until(&s, &id, 2.0 * BUDGET_SECONDS + 1.0).await;
    let last = responses.last().unwrap();
    assert!(
        used > 2.0 * BUDGET_SECONDS + 1.0,
        "a run was not ok: {last}"
    );
    let r = run(&s, &id, "print(x)").await;
    assert_eq!(r["stdout"], "1\n", "{r}");
}

/// A run that ignores its interrupt and spins on: the grace before the kill is long, the
/// CPU-time budget stops it first. The session is gone, and says why.
#[tokio::test]
async fn a_session_run_that_burns_its_cpu_budget_is_killed_and_the_session_says_why() {
    let s = server(Options::default().env("SNAKECAGE_SESSIONS__INTERRUPT_GRACE_MS", 600_000)).await;
    let watchdog = watchdog(&s).await;
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
    assert!(notice.contains(&run_used_up(watchdog)), "{r}");
    let (status, detail) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 410, "{detail}");
}

/// Hostile code that gets past the Python layer (switched off here) may ignore SIGXCPU
/// and raise its soft `RLIMIT_CPU` to its hard one, but not the hard one: where the kernel
/// enforces each run's budget that hard limit is a second further, and kills it; where
/// the service does, its watchdog kills it, and the kernel's limit is the session's life's.
#[tokio::test]
async fn a_run_that_ignores_sigxcpu_and_raises_its_soft_limit_is_still_killed() {
    let options =
        crate::escapes::python_layer_off().env("SNAKECAGE_SESSIONS__INTERRUPT_GRACE_MS", 600_000);
    let s = server(options).await;
    let watchdog = watchdog(&s).await;
    let id = s.new_session().await;
    run(&s, &id, "x = 1").await;
    let code = "import resource, signal
signal.signal(signal.SIGXCPU, lambda *_: None)
soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
try:
    resource.setrlimit(resource.RLIMIT_CPU, (hard + 60, hard + 60))
except (ValueError, OSError) as e:
    print('hard limit kept:', type(e).__name__, flush=True)
resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
print('soft limit raised to', resource.getrlimit(resource.RLIMIT_CPU)[0] == hard, flush=True)
while True:
    try:
        while True:
            pass
    except KeyboardInterrupt:
        pass";
    let r = run(&s, &id, code).await;
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    assert_eq!(
        r["stdout"], "hard limit kept: ValueError\nsoft limit raised to True\n",
        "{r}"
    );
    let notice = r["notice"].as_str().unwrap();
    if watchdog {
        assert!(notice.contains(&run_used_up(true)), "{r}");
    } else {
        // The kernel's SIGKILL at the hard limit: told from no other by its signal alone.
        assert!(notice.contains("its worker was killed by signal 9"), "{r}");
    }
    let (status, detail) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 410, "{detail}");
}

/// A thread a run left spinning burns CPU with no deadline to stop it: all the worker does
/// between runs has one budget in all, and its session says so once it is spent.
#[tokio::test]
async fn a_thread_spinning_between_runs_is_killed_once_the_budget_between_runs_is_spent() {
    let s = server(Options::default()).await;
    let watchdog = watchdog(&s).await;
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
    // No run renews it: the worker is killed (bounded wait: 3 s of CPU on however busy a
    // host), and reaped: the next request then finds it gone, not a socket its dying
    // threads still hold.
    crate::reliability::eventually(600, "the worker is killed and reaped", async || {
        crate::harness::reaped(pid)
    })
    .await;
    let (status, detail) = s
        .post(&format!("/v1/sessions/{id}/execute"), &json!({"code": "1"}))
        .await;
    assert_eq!(status, 410, "{detail}");
    let detail = detail["detail"].as_str().unwrap();
    assert!(detail.contains(&between_used_up(watchdog)), "{detail}");
}

/// Where the service enforces each run's budget, the kernel's limit of a session's worker
/// is `limits.max_session_cpu_seconds` for its whole life: a worker past it is killed
/// however its runs stayed within theirs, and its session says so.
#[tokio::test]
async fn a_session_worker_past_its_cpu_time_for_life_is_killed_by_the_kernel() {
    let s = server(Options::default().env("SNAKECAGE_LIMITS__MAX_SESSION_CPU_SECONDS", 5)).await;
    if !watchdog(&s).await {
        // The kernel's limit is moved around each run there: no limit for life.
        return;
    }
    let id = s.new_session().await;
    let (responses, used) = spin_until(&s, &id, 60.0).await;
    let last = responses.last().unwrap();
    assert_eq!(last["verdict"], "killed", "{responses:?}");
    // Past one run's budget: the runs before got theirs.
    assert!(used > BUDGET_SECONDS, "{used}: {responses:?}");
    assert!(
        last["notice"].as_str().unwrap().contains(
            "its worker used up its CPU time for the session's whole life (5 s: \
             limits.max_session_cpu_seconds) and was killed by signal 24 (SIGXCPU)"
        ),
        "{last}"
    );
}

/// `/proc/<pid>/limits` (which the worker itself may not read: Landlock).
fn limits_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap()
}

/// Soft and hard `RLIMIT_CPU` in `/proc/<pid>/limits` text, in seconds.
fn cpu_limit(limits: &str) -> (u64, u64) {
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

/// The limits themselves, read from `/proc` while a run runs: a stateless job's is
/// `limits.max_timeout_ms` and a second (3 s), its hard limit a second further, whatever
/// the worker started with; a session's worker has as much from its CPU time at the run's
/// start where the kernel enforces it, else `limits.max_session_cpu_seconds`.
#[tokio::test]
async fn a_workers_cpu_limit_is_its_budget_and_its_hard_limit_a_second_further() {
    let s = server(Options::default()).await;
    let watchdog = watchdog(&s).await;
    let (mut stateless, pid, _) =
        pid_and_cpu_time(&s, "/v1/execute/stream", PRINT_PID_AND_CPU_TIME).await;
    assert_eq!(cpu_limit(&limits_of(pid)), (3, 4));
    assert_eq!(stateless.cancel().await, 204);
    stateless.result().await;

    let id = s.new_session().await;
    let path = format!("/v1/sessions/{id}/execute/stream");
    for _ in 0..3 {
        let (mut running, pid, cpu) = pid_and_cpu_time(&s, &path, PRINT_PID_AND_CPU_TIME).await;
        let (soft, hard) = cpu_limit(&limits_of(pid));
        assert_eq!(hard, soft + 1);
        if watchdog {
            assert_eq!((soft, hard), (3600, 3601));
        } else {
            // From its start: the CPU time before it, rounded up, and a budget; the run's
            // own start (before its print) is a few milliseconds at most.
            let from = soft as f64 - BUDGET_SECONDS;
            assert!(cpu - 0.5 < from && from < cpu + 1.0, "{soft} {cpu}");
        }
        assert_eq!(running.cancel().await, 204);
        running.result().await;
        // Past the budget a worker starts with.
        let r = run(&s, &id, &format!("import time\n{SPIN}")).await;
        assert!(r["verdict"] == "ok" || r["verdict"] == "timeout", "{r}");
    }
}
