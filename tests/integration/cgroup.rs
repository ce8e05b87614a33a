//! The instance's cgroup (sandbox layer `cgroup`): all workers together stop at
//! `limits.max_total_processes` (`pids.max`), each with the exception a thread bomb gets,
//! while new workers are still forked (the zygotes are outside it); every instance has a
//! cgroup of its own, removed when it stops, and one left by an instance that was killed
//! is removed by the next start, never a live instance's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Options, Server, THREAD_HOG, TWENTY_THREADS};

/// `limits.max_processes`: one worker's bound (the least the configuration allows is 24).
const MAX_PROCESSES: u32 = 40;
/// `limits.max_total_processes`: below three workers' worth of threads. The least these
/// settings allow is their most workers alive at once (3 sessions + 2 × 1 slot +
/// 2 × (1 + 1 tier × 2) idle + 1 probe = 12) and one worker's 40.
const MAX_TOTAL: u32 = 60;

fn bounded(options: Options) -> Options {
    options
        .env("SNAKECAGE_POOL__SIZE", 1)
        .env("SNAKECAGE_SESSIONS__MAX_SESSIONS", 3)
        .env("SNAKECAGE_TIERS__MIN_IDLE", 0)
        .env("SNAKECAGE_TIERS__PROFILE", r#"[{name = "bare"}]"#)
        .env("SNAKECAGE_LIMITS__MAX_PROCESSES", MAX_PROCESSES)
        .env("SNAKECAGE_LIMITS__MAX_TOTAL_PROCESSES", MAX_TOTAL)
        .env("SNAKECAGE_SANDBOX__REQUIRE", r#"["cgroup", "rlimits"]"#)
}

/// The instance's cgroup directory, as `/health` names it.
fn cgroup_dir(health: &Value) -> PathBuf {
    let layer = &health["sandbox"]["cgroup"];
    assert_eq!(layer["state"], "active", "{health}");
    let detail = layer["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("pids.max "),
        "the detail says the bound: {detail}"
    );
    PathBuf::from(detail.rsplit(' ').next().unwrap())
}

fn read_number(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

fn stdout(r: &Value) -> &str {
    r["stdout"].as_str().unwrap_or_default()
}

/// The number of threads a [`THREAD_HOG`] run says it holds.
fn held(r: &Value) -> u32 {
    let out = stdout(r);
    let n = out
        .strip_prefix("can't start new thread after ")
        .unwrap_or_else(|| panic!("the bomb must stop with the exception: {r}"));
    n.trim().parse().unwrap()
}

fn last_stderr_line(r: &Value) -> Option<&str> {
    r["stderr"].as_str()?.trim_end().lines().last()
}

async fn delete_session(s: &Server, id: &str) {
    let status = s
        .client
        .delete(format!("{}/v1/sessions/{id}", s.base))
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "{status}");
}

#[tokio::test]
async fn sessions_holding_threads_stop_together_at_the_instance_bound_and_workers_still_fork() {
    let s = Server::start_with(bounded(Options::default())).await;
    let health = s.health().await;
    let dir = cgroup_dir(&health);
    assert_eq!(read_number(&dir.join("pids.max")), u64::from(MAX_TOTAL));
    assert!(
        health["sandbox"]["cgroup"]["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("pids.max {MAX_TOTAL} for all workers together")),
        "{health}"
    );

    let sessions = [
        s.new_session().await,
        s.new_session().await,
        s.new_session().await,
    ];
    let mut counts = Vec::new();
    for id in &sessions {
        counts.push(held(&s.session_run(id, THREAD_HOG).await));
    }
    // The first reaches its own worker's bound (all but its main thread); the cgroup
    // stops the others short of theirs: together they never pass the instance's bound.
    assert_eq!(counts[0], MAX_PROCESSES - 1, "{counts:?}");
    assert!(counts[1] < MAX_PROCESSES - 1, "{counts:?}");
    assert!(counts[2] < MAX_PROCESSES - 1, "{counts:?}");
    let threads: u32 = counts.iter().sum::<u32>() + 3;
    assert!(threads <= MAX_TOTAL, "{counts:?}");
    assert!(
        read_number(&dir.join("pids.current")) >= u64::from(MAX_TOTAL),
        "the bound is reached"
    );
    // Their threads stay between runs, and a session at the bound gets the exception.
    let r = s
        .session_run(&sessions[1], "print(sum(t.is_alive() for t in held))")
        .await;
    assert_eq!(stdout(&r), format!("{}\n", counts[1]), "{r}");
    let r = s
        .session_run(&sessions[1], "threading.Thread(target=stop.wait).start()")
        .await;
    assert_eq!(
        last_stderr_line(&r),
        Some("RuntimeError: can't start new thread"),
        "{r}"
    );

    // While they hold every thread: fresh workers are still forked and run (each
    // stateless run takes a new one), and one that wants a thread is refused it.
    for _ in 0..3 {
        let r = s.run("print(1 + 1)").await;
        assert_eq!(stdout(&r), "2\n", "{r}");
        assert_eq!(r["verdict"], "ok", "{r}");
    }
    let r = s
        .run("import threading\nthreading.Thread(target=print).start()")
        .await;
    assert_eq!(
        last_stderr_line(&r),
        Some("RuntimeError: can't start new thread"),
        "{r}"
    );

    // Released, the threads are there for everyone again.
    for id in &sessions {
        delete_session(&s, id).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_number(&dir.join("pids.current")) > 10 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = s.run(TWENTY_THREADS).await;
    assert_eq!(stdout(&r), "20 threads ran\n", "{r}");
    let id = s.new_session().await;
    assert_eq!(
        held(&s.session_run(&id, THREAD_HOG).await),
        MAX_PROCESSES - 1
    );
}

#[tokio::test]
async fn two_instances_have_their_own_cgroups_and_stopping_one_leaves_the_others() {
    let a = Server::start_with(bounded(Options::default())).await;
    let b = Server::start_with(bounded(Options::default())).await;
    let (dir_a, dir_b) = (cgroup_dir(&a.health().await), cgroup_dir(&b.health().await));
    assert_ne!(dir_a, dir_b);
    assert!(dir_a.is_dir() && dir_b.is_dir());
    // A's threads count in A's cgroup only.
    let hog = a.new_session().await;
    assert_eq!(
        held(&a.session_run(&hog, THREAD_HOG).await),
        MAX_PROCESSES - 1
    );
    assert!(read_number(&dir_a.join("pids.current")) >= u64::from(MAX_PROCESSES));
    assert!(read_number(&dir_b.join("pids.current")) < u64::from(MAX_PROCESSES));

    let status = a.stop();
    assert!(status.success(), "{status:?}");
    assert!(!dir_a.exists(), "a stopped instance removes its cgroup");
    assert!(dir_b.is_dir(), "and leaves the other's");
    let r = b.run(TWENTY_THREADS).await;
    assert_eq!(stdout(&r), "20 threads ran\n", "{r}");
    let status = b.stop();
    assert!(status.success(), "{status:?}");
    assert!(!dir_b.exists());
}

#[tokio::test]
async fn a_killed_instances_cgroup_is_removed_at_the_next_start_and_a_live_ones_is_not() {
    // The three instances keep their cgroups' records apart from every other test's: any
    // instance that starts removes the dead ones whose records it sees, and one of another
    // test, starting between the kill and the check below, removed the killed instance's
    // cgroups before this test's next start could (seen in a CI rehearsal).
    let records = tempfile::tempdir().unwrap();
    let apart = || {
        let lock_dir = snakecage::pool::cgroup::LOCK_DIR;
        bounded(Options::default()).wrapper(&crate::harness::in_private_mounts(&format!(
            "mkdir -p {lock_dir} && mount --bind {} {lock_dir}",
            records.path().display()
        )))
    };
    let live = Server::start_with(apart()).await;
    let killed = Server::start_with(apart()).await;
    let (live_dir, killed_dir) = (
        cgroup_dir(&live.health().await),
        cgroup_dir(&killed.health().await),
    );
    // By default each also bounds its workers' memory, in a cgroup of the memory
    // hierarchy, which goes the same way.
    let (live_memory, killed_memory) = (
        memory_dir(&live.health().await),
        memory_dir(&killed.health().await),
    );
    // SIGKILL: no shutdown, the cgroup stays behind (its workers die with their zygotes).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::harness::process_exists(killed.pid()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(killed);
    assert!(
        killed_dir.is_dir() && killed_memory.is_dir(),
        "a killed instance cannot remove its cgroups"
    );

    let next = Server::start_with(apart()).await;
    let next_dir = cgroup_dir(&next.health().await);
    assert!(!killed_dir.exists(), "removed by the next start");
    assert!(!killed_memory.exists(), "both of them");
    assert!(
        live_dir.is_dir() && live_memory.is_dir(),
        "a live instance's cgroups are never touched"
    );
    assert_ne!(next_dir, live_dir);
    let r = live.run(TWENTY_THREADS).await;
    assert_eq!(stdout(&r), "20 threads ran\n", "{r}");
}

/// The service under a mount namespace where the cgroup hierarchies are read-only, as in a
/// container without a delegated cgroup.
fn without_writable_cgroups(options: Options) -> Options {
    options.wrapper(&read_only_cgroups())
}

/// The wrapper [`without_writable_cgroups`] runs the service under.
fn read_only_cgroups() -> Vec<String> {
    crate::harness::in_private_mounts(
        "mount -o remount,bind,ro /sys/fs/cgroup/pids && mount -o remount,bind,ro /sys/fs/cgroup/unified",
    )
}

#[tokio::test]
async fn where_no_cgroup_can_be_made_the_layer_is_unavailable_and_the_service_runs() {
    let s = Server::start_with(
        without_writable_cgroups(Options::default())
            .env("SNAKECAGE_SANDBOX__REQUIRE", r#"["rlimits"]"#),
    )
    .await;
    let health = s.health().await;
    let layer = &health["sandbox"]["cgroup"];
    assert_eq!(layer["state"], "unavailable", "{health}");
    assert!(
        layer["detail"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{health}"
    );
    let r = s.run(TWENTY_THREADS).await;
    assert_eq!(stdout(&r), "20 threads ran\n", "{r}");
}

/// The service (one bare tier) started under `wrapper` with the setting `env`, which must
/// refuse to start: what it said.
fn refused_under(wrapper: &[String], env: (&str, &str)) -> String {
    let mut cmd = std::process::Command::new(&wrapper[0]);
    cmd.args(&wrapper[1..])
        .arg(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(crate::harness::repo_root().join(".venv"))
        .env("SNAKECAGE_TIERS__PROFILE", r#"[{name = "bare"}]"#)
        .env(env.0, env.1);
    let (status, stderr) = crate::harness::refused_start(cmd, Duration::from_secs(300));
    assert!(!status.success(), "{stderr}");
    stderr
}

#[test]
fn requiring_the_layer_where_it_is_unavailable_stops_start_up_saying_why() {
    let stderr = refused_under(
        &read_only_cgroups(),
        ("SNAKECAGE_SANDBOX__REQUIRE", r#"["cgroup"]"#),
    );
    assert!(
        stderr.contains("sandbox.require names layers that are not active: cgroup is Unavailable: creating /sys/fs/cgroup/pids/snakecage-"),
        "{stderr}"
    );
    assert!(stderr.contains("Read-only file system"), "{stderr}");
}

/// `limits.memory_limit_mb` (one worker's own bound) and `limits.max_total_memory_mb`
/// (all workers together): two jobs of most of one worker's bound pass the instance's.
const JOB_MB: u32 = 100;
const TOTAL_MB: u32 = 120;

/// The instance's memory cgroup, as `/health` names it.
fn memory_dir(health: &Value) -> PathBuf {
    let detail = health["sandbox"]["cgroup"]["detail"].as_str().unwrap();
    let said = " for all workers together (limits.max_total_memory_mb) in ";
    let (_, rest) = detail
        .split_once(said)
        .unwrap_or_else(|| panic!("the detail says the memory bound: {detail}"));
    PathBuf::from(rest.split_once("; ").unwrap().0)
}

/// A run of session `id` that keeps `mb` MiB in `held`.
async fn hold(s: &Server, id: &str, mb: u32) {
    let code = format!("held = b'x' * ({mb} << 20)\nprint(len(held) >> 20)");
    let r = s.session_run(id, &code).await;
    assert_eq!(stdout(&r), format!("{mb}\n"), "{r}");
}

/// A stateless run that allocates `mb` MiB.
async fn allocate(s: &Server, mb: u32) -> Value {
    s.run(&format!(
        "data = b'x' * ({mb} << 20)\nprint(len(data) >> 20)"
    ))
    .await
}

fn ended_well(r: &Value, mb: u32) {
    let said = format!("{mb}\n");
    assert_eq!(
        (r["verdict"].as_str(), stdout(r)),
        (Some("ok"), said.as_str()),
        "{r}"
    );
}

/// The memory cgroup `dir` counts `n` workers killed for memory.
fn kernel_counted(dir: &Path, n: u32) {
    let control = std::fs::read_to_string(dir.join("memory.oom_control")).unwrap();
    assert!(control.contains(&format!("oom_kill {n}\n")), "{control}");
}

/// Session `id`'s next call finds it gone (410), its worker killed for memory.
async fn gone_for_memory(s: &Server, id: &str) {
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &serde_json::json!({ "code": "print(len(held))" }),
        )
        .await;
    let said = r.to_string();
    assert_eq!(status, 410, "{said}");
    assert!(
        said.contains("its worker was killed by signal 9 (SIGKILL): the kernel's out-of-memory killer, most likely"),
        "{said}"
    );
}

/// Waits until what the kernel charges the workers is back below 20 MiB: a worker's
/// memory comes back as the kernel tears it down, after its kill or its result.
async fn memory_comes_back(s: &Server) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = s.health().await;
        let used = health["workers_memory"]["used_bytes"].as_u64().unwrap();
        if used < 20 << 20 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the workers' memory is still charged after 30 s: {health}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const OOM_KILLED: &str = "The worker was killed by signal 9 (SIGKILL): the kernel's \
     out-of-memory killer, most likely: the instance's cgroup counted 1 of its workers killed \
     for memory while this one was alive, which happens when all workers together reach \
     limits.max_total_memory_mb (120 MiB) or the host runs out of memory; the kernel kills the \
     largest worker, not always the one allocating.";

#[tokio::test]
async fn the_workers_memory_together_is_bounded_and_a_worker_killed_for_it_is_told_why() {
    let s = Server::start_with(
        bounded(Options::default())
            .env("SNAKECAGE_LIMITS__MEMORY_LIMIT_MB", JOB_MB)
            .env("SNAKECAGE_LIMITS__MAX_TOTAL_MEMORY_MB", TOTAL_MB),
    )
    .await;
    let health = s.health().await;
    let dir = memory_dir(&health);
    let detail = health["sandbox"]["cgroup"]["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!(
            "; memory {TOTAL_MB} MiB for all workers together (limits.max_total_memory_mb) in "
        )),
        "{detail}"
    );
    assert_eq!(
        read_number(&dir.join("memory.limit_in_bytes")),
        u64::from(TOTAL_MB) << 20
    );
    assert_eq!(cgroup_dir(&health).file_name(), dir.file_name());
    // The workspaces' own tmpfs (a quarter of the host's memory) is larger than this
    // bound, which the files workers write count against: the log says what that means.
    assert!(
        s.log()
            .contains("the workspaces' file system is larger than limits.max_total_memory_mb"),
        "{}",
        s.log()
    );

    // A session holds 40 MiB. A stateless job of 95 MiB, within its own bound, takes the
    // workers together past 120: the kernel kills the largest, the job, and its client
    // is told so.
    let holder = s.new_session().await;
    hold(&s, &holder, 40).await;
    let r = allocate(&s, 95).await;
    assert_eq!(r["verdict"], "memory_limit", "{r}");
    assert_eq!(stdout(&r), "", "{r}");
    assert_eq!(last_stderr_line(&r), Some(OOM_KILLED), "{r}");
    kernel_counted(&dir, 1);
    let health = s.health().await;
    let memory = &health["workers_memory"];
    assert_eq!(memory["limit_bytes"], u64::from(TOTAL_MB) << 20, "{health}");
    assert_eq!(memory["oom_kills"], 1, "{health}");
    let used = memory["used_bytes"].as_u64().unwrap();
    assert!(
        (40 << 20..u64::from(TOTAL_MB) << 20).contains(&used),
        "the session's 40 MiB are charged: {health}"
    );
    let (_, _, metrics) = s.get("/metrics").await;
    for series in [
        "snakecage_workers_memory_limit_bytes 125829120",
        "snakecage_workers_oom_kills 1",
        r#"snakecage_workers_killed_total{reason="out_of_memory"} 1"#,
        r#"snakecage_workers_killed_total{reason="crashed"} 0"#,
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
    // The session, the smaller, keeps its state; with it gone the same job fits.
    let r = s.session_run(&holder, "print(len(held) >> 20)").await;
    assert_eq!(stdout(&r), "40\n", "{r}");
    delete_session(&s, &holder).await;
    // Its worker is killed at once; its memory comes back as the kernel tears it down.
    memory_comes_back(&s).await;
    ended_well(&allocate(&s, 95).await, 95);

    memory_comes_back(&s).await;
    // The largest is not always the one allocating: a session holding 90 MiB is killed
    // for a stateless job of 60, which then ends well, and the session's next call says
    // why it is gone.
    let big = s.new_session().await;
    hold(&s, &big, 90).await;
    ended_well(&allocate(&s, 60).await, 60);
    gone_for_memory(&s, &big).await;
    kernel_counted(&dir, 2);

    // Files a worker writes count too (workspace tmpfs pages are charged to their writer),
    // and killing their writer would not free them: a stateless job writing 80 MiB while
    // a session holds 60 gets the session, the largest, killed, and ends well.
    memory_comes_back(&s).await;
    let holder = s.new_session().await;
    hold(&s, &holder, 60).await;
    let r = s
        .run(
            "with open('big.bin', 'wb') as f:\n    for _ in range(80):\n        f.write(b'x' * (1 << 20))\nimport os\nprint(os.path.getsize('big.bin') >> 20)",
        )
        .await;
    ended_well(&r, 80);
    gone_for_memory(&s, &holder).await;
    kernel_counted(&dir, 3);
    // The service serves on, and stopping removes the memory cgroup with the other.
    let r = s.run("print(1 + 1)").await;
    assert_eq!(stdout(&r), "2\n", "{r}");
    let status = s.stop();
    assert!(status.success(), "{status:?}");
    assert!(
        !dir.exists(),
        "a stopped instance removes its memory cgroup"
    );
}

/// The service with only the memory hierarchy read-only.
fn read_only_memory_cgroup() -> Vec<String> {
    crate::harness::in_private_mounts("mount -o remount,bind,ro /sys/fs/cgroup/memory")
}

#[tokio::test]
async fn where_no_memory_cgroup_can_be_made_the_default_bound_says_why_and_a_set_one_stops_start_up()
 {
    let s =
        Server::start_with(bounded(Options::default()).wrapper(&read_only_memory_cgroup())).await;
    let health = s.health().await;
    let detail = health["sandbox"]["cgroup"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("; memory not bounded: creating /sys/fs/cgroup/memory/")
            && detail.contains("Read-only file system (os error 30); cgroup v1 "),
        "{detail}"
    );
    // Threads are still bounded together.
    assert_eq!(
        read_number(&cgroup_dir(&health).join("pids.max")),
        u64::from(MAX_TOTAL)
    );
    let r = s.run("print(1 + 1)").await;
    assert_eq!(stdout(&r), "2\n", "{r}");
    drop(s);

    let stderr = refused_under(
        &read_only_memory_cgroup(),
        ("SNAKECAGE_LIMITS__MAX_TOTAL_MEMORY_MB", "512"),
    );
    assert!(
        stderr.contains("limits.max_total_memory_mb = 512 bounds the workers' memory in the instance's cgroup, which could not be made: creating /sys/fs/cgroup/memory/"),
        "{stderr}"
    );
    assert!(stderr.contains("Read-only file system"), "{stderr}");
}

/// A process's `oom_score_adj` and its real uid, read as root.
fn oom_adj_and_uid(pid: u32) -> Option<(i32, u32)> {
    let adj = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((adj.trim().parse().ok()?, uid))
}

#[tokio::test]
async fn workers_are_the_first_the_out_of_memory_killer_ends_and_the_service_is_not() {
    let s = Server::start_with(bounded(Options::default())).await;
    s.wait_for_idle(1).await;
    let session = s.new_session().await;
    let r = s.session_run(&session, "print(1 + 1)").await;
    assert_eq!(stdout(&r), "2\n", "{r}");
    // And an idle one beside the session's: Ready, so past its uid drop.
    s.wait_for_idle(1).await;
    let mut workers = 0;
    let mut zygotes = 0;
    for pid in crate::harness::descendants_of(s.pid()) {
        // Gone meanwhile (a refill's worker, the probe): nothing to check.
        let Some((adj, uid)) = oom_adj_and_uid(pid) else {
            continue;
        };
        if uid == 0 {
            // A zygote, or a worker forked and not yet at its uid drop (the score comes
            // before it, so one may be either).
            assert!(adj == 0 || adj == 1000, "pid {pid}: {adj}");
            zygotes += usize::from(adj == 0);
        } else {
            assert_eq!(adj, 1000, "worker {pid} (uid {uid})");
            workers += 1;
        }
    }
    assert!(workers >= 2, "the idle worker and the session's: {workers}");
    assert!(zygotes >= 1, "the zygote keeps its score");
    let (adj, _) = oom_adj_and_uid(s.pid()).unwrap();
    assert_eq!(adj, 0, "the service keeps its score");
}
