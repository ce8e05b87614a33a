//! Refilling the pool: a take asks for its own replacement, the zygote makes it once a
//! child has exited (or after a short delay when none does), and what the pool reports
//! (idle, spawning, workers spawned, the zygote's children) stays exact through it all.

use serde_json::{Value, json};

use crate::harness::{Options, Server, children_of};
use crate::reliability::eventually;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// One tier with nothing preloaded: quick to start, and every count is that tier's.
const ONE_TIER: &str = r#"[{name = "bare", preload = []}]"#;

async fn one_tier_server() -> Server {
    Server::start_with(Options::default().env("SNAKECAGE_TIERS__PROFILE", ONE_TIER)).await
}

fn zygote_pid(health: &Value) -> u32 {
    health["pool"]["zygote"]["pid"].as_u64().unwrap() as u32
}

/// `pid`'s scheduling policy (`libc::SCHED_IDLE`, `libc::SCHED_OTHER`, …).
fn policy_of(pid: u32) -> libc::c_int {
    // SAFETY: sched_getscheduler takes a pid and returns the policy or -1.
    unsafe { libc::sched_getscheduler(pid as i32) }
}

/// Whether `pid` is a zombie (exited, not reaped).
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat.rsplit_once(')')?.1.trim_start().to_owned();
            rest.chars().next()
        })
        == Some('Z')
}

/// Waits until the pool is full and settled: every tier at its idle target, nothing being
/// spawned, and the zygote's children exactly the idle workers plus `busy` more (none
/// exited and unreaped). Returns `/health`.
async fn settled(s: &Server, busy: usize) -> Value {
    let mut last = Value::Null;
    eventually(
        20,
        "the pool full again, every child accounted for",
        async || {
            let health = s.health().await;
            let pool = &health["pool"];
            let tier = &pool["tiers"][0];
            let idle = pool["idle"].as_u64().unwrap();
            let children = children_of(zygote_pid(&health));
            let full = tier["idle"].as_u64() == tier["target_idle"].as_u64()
                && pool["spawning"].as_u64() == Some(0)
                && children.len() as u64 == idle + busy as u64
                && !children.iter().any(|&pid| is_zombie(pid));
            last = health;
            full
        },
    )
    .await;
    last
}

#[tokio::test]
async fn a_worker_kept_by_a_session_is_replaced_though_no_worker_exits() {
    let s = one_tier_server().await;
    let before = settled(&s, 0).await;
    let spawned = before["pool"]["workers_spawned"].as_u64().unwrap();

    // A session keeps its worker alive: no child exits, so the zygote's fork of the
    // replacement can only come from its own delay running out.
    let (status, r) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{r}");
    let after = settled(&s, 1).await;
    assert_eq!(
        after["pool"]["workers_spawned"].as_u64().unwrap(),
        spawned + 1,
        "exactly one replacement: {after}"
    );
    // And the session's worker is the one it was given: it runs.
    let id = r["session_id"].as_str().unwrap();
    let (status, run) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "x = 6 * 7\nprint(x)"}),
        )
        .await;
    assert_eq!(
        (status, run["stdout"].as_str()),
        (200, Some("42\n")),
        "{run}"
    );
}

#[tokio::test]
async fn every_take_is_replaced_exactly_once_and_the_counts_stay_exact() {
    let s = one_tier_server().await;
    let before = settled(&s, 0).await;
    let spawned = before["pool"]["workers_spawned"].as_u64().unwrap();

    // One after another (each replacement asked for by its take, made after the job's
    // worker exits), then eight at once (takes racing to stock the same tier), with
    // endings of every kind: a result, an uncaught exception, a crash, a timeout.
    let jobs = [
        (json!({"code": "print('é' * 3)"}), "ok"),
        (json!({"code": "raise ValueError('no')"}), "error"),
        (
            // C-level recursion CPython does not bound: the worker dies of SIGSEGV.
            json!({"code": "x = iter([1])\nfor _ in range(10**6):\n    x = map(abs, x)\nprint(next(x))", "timeout_ms": 10000}),
            "killed",
        ),
        (
            json!({"code": "while True: pass", "timeout_ms": 300}),
            "timeout",
        ),
    ];
    let mut runs = 0;
    for round in 0..3 {
        for (body, verdict) in &jobs {
            let r = s.run_with(body.clone()).await;
            assert_eq!(r["verdict"], *verdict, "round {round}: {r}");
            if *verdict == "killed" {
                // The zygote's report of the exit, sent with its next fork reply, still
                // names the signal.
                let stderr = r["stderr"].as_str().unwrap();
                assert!(stderr.ends_with("killed by signal 11 (SIGSEGV)."), "{r}");
            }
            runs += 1;
        }
    }
    let together = (0..8).map(|i| {
        let s = &s;
        async move {
            let r = s.run(&format!("print({i} * 2)")).await;
            assert_eq!(r["stdout"], format!("{}\n", i * 2), "{r}");
        }
    });
    futures_util::future::join_all(together).await;
    runs += 8;

    let after = settled(&s, 0).await;
    // Workers made while jobs waited skip the warm-up; those left idle afterwards are
    // replaced by warmed ones, each once.
    let replaced = |health: &Value| {
        health["pool"]["tiers"][0]["cold_workers_replaced"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        after["pool"]["workers_spawned"].as_u64().unwrap(),
        spawned + runs + replaced(&after) - replaced(&before),
        "one replacement per take, no more: {after}"
    );
    let metrics = s.get("/metrics").await.2;
    let gauge = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(
        gauge("snakecage_pool_idle_workers"),
        after["pool"]["idle"].as_f64(),
        "{metrics}"
    );
    assert_eq!(
        gauge("snakecage_pool_spawning_workers"),
        Some(0.0),
        "{metrics}"
    );
}

/// Minor page faults of `pid` since it was forked (`/proc/PID/stat`, field 10).
fn minor_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(7).unwrap().parse().unwrap()
}

/// A worker asked for while jobs already wait for one skips its tier's warm-up (they would
/// wait for it, then pay their own run on top); one made ahead of demand runs it. Seen from
/// outside: an idle worker of this tier that ran the numpy and pandas warm-ups has copied
/// ~900 pages, one that did not ~300, and `/health` counts the second kind.
#[tokio::test]
async fn workers_asked_for_while_jobs_wait_skip_the_warm_up() {
    let s = Server::start_with(
        Options::default()
            .env(
                "SNAKECAGE_TIERS__PROFILE",
                r#"[{name = "sci", preload = ["numpy", "pandas"]}]"#,
            )
            .env("SNAKECAGE_TIERS__MIN_IDLE", 0)
            .env("SNAKECAGE_POOL__SIZE", 3),
    )
    .await;
    let cold_level = 600;
    let all_warm = |zygote: u32, when: &str| {
        let faults: Vec<u64> = children_of(zygote).into_iter().map(minor_faults).collect();
        assert!(
            faults.iter().all(|&f| f > cold_level),
            "{when}: every worker warmed: {faults:?}"
        );
    };
    // The tier's first worker skipped the warm-up (the service was ready sooner) and was
    // replaced by a warmed one.
    let health = settled(&s, 0).await;
    let zygote = zygote_pid(&health);
    all_warm(zygote, "started");
    let tier = &health["pool"]["tiers"][0];
    assert_eq!(tier["workers_spawned_cold"], 1, "{health}");

    // Paced: nothing waits, every replacement is warmed.
    for i in 0..3 {
        assert_eq!(
            s.run(&format!("print({i})")).await["stdout"],
            format!("{i}\n")
        );
        settled(&s, 0).await;
    }
    let health = settled(&s, 0).await;
    assert_eq!(
        health["pool"]["tiers"][0]["workers_spawned_cold"], 1,
        "{health}"
    );

    // Forking ahead of demand is background work.
    assert_eq!(policy_of(zygote), libc::SCHED_IDLE, "{health}");

    // The zygote held still: jobs take every idle worker (their replacements are asked
    // for, with the warm-up, not made), then as many more find none and wait: each asks one
    // of those replacements to skip its warm-up, which none has begun.
    kill(Pid::from_raw(zygote as i32), Signal::SIGSTOP).unwrap();
    let idle = health["pool"]["idle"].as_u64().unwrap();
    // As many as may run at once: a job beyond the pool size would wait for a slot, not
    // for a worker.
    assert_eq!(idle, 3, "{health}");
    for i in 0..idle {
        assert_eq!(
            s.run(&format!("print({i})")).await["stdout"],
            format!("{i}\n")
        );
    }
    assert_eq!(s.health().await["pool"]["idle"], 0);
    // As many as the replacements asked for: each is told, and each of these jobs runs on
    // one of them.
    let waiting: Vec<_> = (0..idle)
        .map(|i| {
            let code = format!("import time\ntime.sleep(4)\nimport subprocess\nprint({i})");
            s.spawn_execute(json!({ "code": code, "timeout_ms": 30_000 }))
        })
        .collect();
    eventually(10, "the jobs waiting for a worker", async || {
        s.health().await["pool"]["queue_depth"].as_u64() == Some(idle)
    })
    .await;
    // Jobs wait for its forks: they are no background work now.
    assert_eq!(
        policy_of(zygote),
        libc::SCHED_OTHER,
        "raised while jobs wait"
    );
    kill(Pid::from_raw(zygote as i32), Signal::SIGCONT).unwrap();
    // While they sleep: started cold, besides the tier's first, the `idle` replacements
    // asked for before any job waited (each told by a waiting job), and those asked for as
    // the waiting jobs were served while another still waited (at most all but the last:
    // waiters served together see none left). Once none waits, idle ones that started
    // cold are replaced by warmed ones: the cold workers left are those running the jobs.
    let health = settled(&s, idle as usize).await;
    let cold_started = health["pool"]["tiers"][0]["workers_spawned_cold"]
        .as_u64()
        .unwrap();
    let faults: Vec<u64> = children_of(zygote).into_iter().map(minor_faults).collect();
    let cold = faults.iter().filter(|&&f| f < cold_level).count() as u64;
    assert!(
        (1 + idle..=1 + idle + (idle - 1)).contains(&cold_started),
        "{health}"
    );
    assert_eq!(cold, idle, "the workers' faults {faults:?}: {health}");
    for (i, handle) in waiting.into_iter().enumerate() {
        let r = handle.await.unwrap();
        // Cold or warm, every sandbox layer holds.
        assert_eq!(r["exit_code"], 1, "job {i}: {r}");
        assert!(
            r["stderr"]
                .as_str()
                .unwrap()
                .contains("import of 'subprocess' is not allowed"),
            "job {i}: {r}"
        );
    }
    assert_eq!(
        s.scrape()
            .await
            .get("snakecage_tier_cold_starts_total", &[("tier", "sci")]),
        cold_started as f64
    );
    settled(&s, 0).await;
    all_warm(zygote, "after the burst");
    assert_eq!(
        policy_of(zygote),
        libc::SCHED_IDLE,
        "lowered once none waits"
    );
}

/// A job that starts waiting asks a worker on its way to skip its warm-up; one whose
/// warm-up has already begun finishes it and sets the request aside, ahead of its job.
/// Held in its warm-up (the plotting tier's figure to PNG, ~100 ms) while the job waits, the
/// worker still serves it, warmed.
#[tokio::test]
async fn a_skip_that_comes_after_the_warm_up_began_is_set_aside() {
    let s = Server::start_with(
        Options::default()
            .env(
                "SNAKECAGE_TIERS__PROFILE",
                r#"[{name = "plot", preload = ["matplotlib", "matplotlib.pyplot"]}]"#,
            )
            .env("SNAKECAGE_TIERS__MIN_IDLE", 0)
            .env("SNAKECAGE_POOL__SIZE", 1),
    )
    .await;
    let health = settled(&s, 0).await;
    let zygote = zygote_pid(&health);
    let before = children_of(zygote);
    assert_eq!(before.len(), 1, "one idle worker: {health}");
    let cold_before = &health["pool"]["tiers"][0]["workers_spawned_cold"];
    assert_eq!(cold_before, 1, "the tier's first worker: {health}");
    // The idle worker is taken; its replacement is asked for, with the warm-up, as nothing
    // waits.
    assert_eq!(s.run("print('ünïcode')").await["stdout"], "ünïcode\n");
    // Caught once it has copied more pages than a worker that skips the warm-up, well
    // before the end of it (~2,500 pages), and held there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let worker = loop {
        let new = children_of(zygote)
            .into_iter()
            .find(|pid| !before.contains(pid) && minor_faults(*pid) > 600);
        if let Some(pid) = new {
            kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no replacement warmed up"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(s.health().await["pool"]["spawning"], 1, "held before Ready");
    assert_eq!(
        policy_of(worker),
        libc::SCHED_IDLE,
        "forked as background work"
    );
    let job = s.spawn_execute(json!({ "code": "x = 'ß' * 3\nprint(x)" }));
    eventually(10, "the job waiting for a worker", async || {
        s.health().await["pool"]["queue_depth"].as_u64() == Some(1)
    })
    .await;
    // The worker on its way is what the job waits for: raised, as is the zygote.
    eventually(10, "the worker on its way raised", async || {
        policy_of(worker) == libc::SCHED_OTHER
    })
    .await;
    assert_eq!(policy_of(zygote), libc::SCHED_OTHER);
    kill(Pid::from_raw(worker as i32), Signal::SIGCONT).unwrap();
    let r = job.await.unwrap();
    assert_eq!(
        (&r["stdout"], &r["exit_code"]),
        (&json!("ßßß\n"), &json!(0)),
        "{r}"
    );
    let health = settled(&s, 0).await;
    assert_eq!(
        health["pool"]["tiers"][0]["workers_spawned_cold"], 1,
        "only the tier's first: {health}"
    );
    assert_eq!(
        policy_of(zygote),
        libc::SCHED_IDLE,
        "lowered once none waits"
    );
}

/// Normal-priority processes spinning on CPU 0, killed and reaped when dropped, whatever
/// the test's outcome.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn on_cpu_0(count: usize) -> Self {
        Self(
            (0..count)
                .map(|_| {
                    std::process::Command::new("taskset")
                        .args(["-c", "0", "/bin/sh", "-c", "while :; do :; done"])
                        .spawn()
                        .expect("taskset")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Workers the refill starts while no job waits run at background priority; on a host
/// whose CPU is kept busy by normal-priority work they get almost none and are late past
/// `pool.spawn_timeout_ms`. Late is not broken: such a worker (runnable, held back) is
/// waited for, so none is killed, no spawn failure is counted and `/health` stays ok,
/// and once the CPU is free the pool is full again.
#[tokio::test]
async fn workers_starved_by_a_busy_host_are_waited_for_not_killed() {
    // What the service said of the workers it gave up on: how much CPU each had, and
    // where it slept.
    let not_ready = |s: &Server| -> String {
        let log = s.log();
        log.lines()
            .filter(|l| l.contains("not ready after"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_TIERS__PROFILE", ONE_TIER)
            .env("SNAKECAGE_POOL__SPAWN_TIMEOUT_MS", 1000)
            .wrapper(&["taskset", "-c", "0"]),
    )
    .await;
    settled(&s, 0).await;
    // Four spinning processes on the service's only CPU leave a background process well
    // under a millisecond of CPU per second.
    let hogs = Hogs::on_cpu_0(4);
    // The jobs run at normal priority; their replacements start in the background.
    for _ in 0..3 {
        assert_eq!(s.run("print(1)").await["stdout"], "1\n");
    }
    // Several spawn timeouts long: without the hogs, a worker of this tier starts in a few
    // milliseconds of CPU; beside them, in seconds.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let during = s.health().await;
    drop(hogs);
    assert_eq!(
        (
            during["status"].clone(),
            during["pool"]["spawn_failures"].clone()
        ),
        (json!("ok"), json!(0)),
        "{during:#}\n{}",
        not_ready(&s)
    );
    let after = settled(&s, 0).await;
    assert_eq!(
        after["pool"]["spawn_failures"],
        0,
        "{after:#}\n{}",
        not_ready(&s)
    );
}
