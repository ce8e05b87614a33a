//! Every worker under a uid of its own: what the kernel counts per uid (RLIMIT_NPROC:
//! processes and threads) bounds one worker, so a tenant holding threads up to its limit
//! takes none from another's; the ids come from a range the instance claims for itself,
//! which another instance on the host never shares, and are reused only once the worker
//! that had one is reaped and its workspace removed.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::Value;

use crate::harness::{Options, Server, THREAD_HOG, TWENTY_THREADS, descendants_of, process_exists};
use crate::reliability::until;

/// `limits.max_processes` of these tests: low, so holding every thread a worker may have
/// is quick; the least the configuration allows is 24 (8 tool calls in flight + 16).
const MAX_PROCESSES: u32 = 40;

fn uids(health: &Value) -> (u64, u64) {
    let uids = &health["sandbox"]["worker_uids"];
    assert_eq!(uids["per_worker"], true, "{health}");
    (
        uids["first"].as_u64().unwrap(),
        uids["last"].as_u64().unwrap(),
    )
}

fn stdout(r: &Value) -> &str {
    r["stdout"].as_str().unwrap_or_default()
}

fn small(options: Options) -> Options {
    options
        .env("SNAKECAGE_LIMITS__MAX_PROCESSES", MAX_PROCESSES)
        .env(
            "SNAKECAGE_SANDBOX__REQUIRE",
            r#"["drop_privileges", "rlimits"]"#,
        )
}

#[tokio::test]
async fn a_session_holding_every_thread_it_may_have_takes_none_from_another_tenant() {
    let s = Server::start_with(small(Options::default())).await;
    let hog = s.new_session().await;
    // Everything one worker may have but its main thread: the bomb stops, in its worker.
    let r = s.session_run(&hog, THREAD_HOG).await;
    assert_eq!(
        stdout(&r),
        format!("can't start new thread after {}\n", MAX_PROCESSES - 1),
        "{r}"
    );
    // Its threads are still there between runs...
    let r = s
        .session_run(&hog, "print(sum(t.is_alive() for t in held))")
        .await;
    assert_eq!(stdout(&r), format!("{}\n", MAX_PROCESSES - 1), "{r}");
    // ...and another tenant's runs start theirs: stateless, and in another session
    // (before, every worker shared one uid and these failed with `can't start new thread`).
    for _ in 0..3 {
        let r = s.run(TWENTY_THREADS).await;
        assert_eq!(stdout(&r), "20 threads ran\n", "{r}");
        assert_eq!(r["verdict"], "ok", "{r}");
    }
    let other = s.new_session().await;
    let r = s.session_run(&other, TWENTY_THREADS).await;
    assert_eq!(stdout(&r), "20 threads ran\n", "{r}");
    // The hog itself stays at its limit.
    let r = s
        .session_run(&hog, "threading.Thread(target=stop.wait).start()")
        .await;
    let last = r["stderr"].as_str().unwrap().trim_end().lines().last();
    assert_eq!(last, Some("RuntimeError: can't start new thread"), "{r}");
}

#[tokio::test]
async fn each_worker_runs_under_its_own_uid_from_the_claimed_range_and_owns_its_files() {
    let s = Server::start_with(small(Options::default())).await;
    let health = s.health().await;
    let (first, last) = uids(&health);
    assert!(first >= 40_000 && last <= 59_999, "{health}");
    assert_eq!(health["sandbox"]["drop_privileges"]["state"], "active");
    assert!(
        health["sandbox"]["worker_uids"]["in_use"].as_u64().unwrap() >= 1,
        "{health}"
    );

    let code = "import os\nopen('mine-Ω.txt', 'w').write('x')\nprint(os.getuid(), os.stat('mine-Ω.txt').st_uid, os.getgid(), os.getgroups())";
    let (a, b) = (s.new_session().await, s.new_session().await);
    let ra = s.session_run(&a, code).await;
    let rb = s.session_run(&b, code).await;
    let uid_of = |r: &Value| -> u64 {
        let out = stdout(r);
        let fields: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(fields.len(), 4, "{r}");
        assert_eq!(fields[0], fields[1], "the file is the worker's own: {r}");
        assert_eq!(
            &out[out.find(' ').unwrap()..],
            format!(" {} 65534 []\n", fields[0])
        );
        fields[0].parse().unwrap()
    };
    let (ua, ub) = (uid_of(&ra), uid_of(&rb));
    assert_ne!(ua, ub, "two live workers never share a uid");
    for uid in [ua, ub] {
        // The range's first id is the start-up probe's, never a worker's.
        assert!(
            first < uid && uid <= last,
            "{uid} not in {first}+1..={last}"
        );
    }
    // A session keeps its worker, and so its uid, for its life.
    let again = s.session_run(&a, "import os\nprint(os.getuid())").await;
    assert_eq!(stdout(&again), format!("{ua}\n"));
    // Seen from the host: the file in the session's workspace is owned by that uid.
    let owners = owners_of(s.state_dir(), "mine-Ω.txt");
    assert!(
        owners.contains(&(ua as u32)) && owners.contains(&(ub as u32)),
        "{owners:?}"
    );
    // A stateless run's uid is in the range too, and not a live session's.
    for _ in 0..3 {
        let r = s.run("import os\nprint(os.getuid())").await;
        let uid: u64 = stdout(&r).trim().parse().unwrap();
        assert!(first < uid && uid <= last, "{r}");
        assert!(uid != ua && uid != ub, "{r}");
    }
    let health = s.health().await;
    let in_use = health["sandbox"]["worker_uids"]["in_use"].as_u64().unwrap();
    assert!(in_use >= 2 && in_use <= last - first, "{health}");
}

/// The owners of every file named `name` in the workspaces under `state_dir`.
fn owners_of(state_dir: &Path, name: &str) -> Vec<u32> {
    crate::harness::workspaces_under(state_dir)
        .iter()
        .filter_map(|ws| std::fs::metadata(ws.join(name)).ok())
        .map(|meta| meta.uid())
        .collect()
}

/// The smallest configuration: one tier, one slot, one session, no idle floor; its most
/// workers at once is 1 + 2 + 2 × (1 + 2) + 1 = 10, and one id more is the probe's.
fn tiny(options: Options) -> Options {
    options
        .env("SNAKECAGE_POOL__SIZE", 1)
        .env("SNAKECAGE_SESSIONS__MAX_SESSIONS", 1)
        .env("SNAKECAGE_TIERS__MIN_IDLE", 0)
        .env("SNAKECAGE_TIERS__PROFILE", r#"[{name = "bare"}]"#)
}

#[tokio::test]
async fn uids_come_back_once_their_workers_are_reaped_also_when_their_zygote_dies() {
    uids_come_back(Options::default()).await;
}

/// The same as PID 1 of a PID namespace (a container without an init): the workers its
/// dead zygotes leave are the service's own to reap, or their zombies would keep their ids.
#[tokio::test]
async fn uids_come_back_when_the_service_is_pid_1_and_reaps_its_dead_zygotes_workers() {
    uids_come_back(Options::default().wrapper(&[
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child=SIGTERM",
    ]))
    .await;
}

/// The host pid of the process below `service` whose pid in its own namespace is `pid`.
fn host_pid(service: u32, pid: i64) -> i32 {
    descendants_of(service)
        .into_iter()
        .find(|p| {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let nspid = status.lines().find(|l| l.starts_with("NSpid:"));
            nspid.and_then(|l| l.split_whitespace().last()) == Some(pid.to_string().as_str())
        })
        .map(|p| p as i32)
        .unwrap_or_else(|| panic!("no process below {service} is {pid} in its namespace"))
}

async fn uids_come_back(options: Options) {
    let s = Server::start_with(tiny(small(options)).env("SNAKECAGE_SANDBOX__UID_COUNT", 11)).await;
    let health = s.health().await;
    let (first, last) = uids(&health);
    assert_eq!(last - first + 1, 11, "{health}");
    // Three times as many runs as there are ids, each writing a file its workspace keeps
    // until it is collected: every id is reused, none while its worker lives.
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..30 {
        let r = s
            .run(&format!(
                "import os\nopen('out{i}.txt', 'w').write('x')\nprint(os.getuid())"
            ))
            .await;
        assert_eq!(r["verdict"], "ok", "{r}");
        seen.insert(stdout(&r).trim().parse::<u64>().unwrap());
    }
    assert!(seen.iter().all(|u| first < *u && *u <= last), "{seen:?}");
    // The zygote dies (its workers with it, reaped by whoever inherits them) ten times:
    // their ids come back once they are gone, or the tier could not start workers.
    for _ in 0..10 {
        let pid = s.health().await["pool"]["zygote"]["pid"].as_i64().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(host_pid(s.pid(), pid)),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        s.wait_for_pool("a new zygote", |p| {
            p["zygote"]["pid"].as_i64().is_some_and(|p| p != pid) && p["idle"] != 0
        })
        .await;
        let r = s.run("import os\nprint(os.getuid())").await;
        assert_eq!(r["verdict"], "ok", "{r}");
    }
    // Only live workers hold ids in the end (those of the last zygote's workers come
    // back as soon as the scan finds them gone).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let health = s.health().await;
        assert_eq!(health["last_spawn_error"], Value::Null, "{health}");
        let in_use = health["sandbox"]["worker_uids"]["in_use"].as_u64().unwrap();
        let live = descendants_of(s.pid()).len() as u64;
        if in_use <= live {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{in_use} ids in use, {live} processes below the service: {health}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // No dead worker is left unreaped under an id of the range (as PID 1, one whose fork
    // its zygote never reported is the service's alone to reap), and it stops when told.
    until(
        deadline,
        async || {
            let zombies: Vec<u32> = descendants_of(s.pid())
                .into_iter()
                .filter(|p| {
                    let status =
                        std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
                    status.lines().any(|l| l.starts_with("State:\tZ"))
                        && status
                            .lines()
                            .find_map(|l| l.strip_prefix("Uid:"))
                            .and_then(|u| u.split_whitespace().next()?.parse::<u64>().ok())
                            .is_some_and(|u| first < u && u <= last)
                })
                .collect();
            if zombies.is_empty() {
                Ok(())
            } else {
                Err(zombies)
            }
        },
        |zombies| {
            let statuses: Vec<String> = zombies
                .iter()
                .map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default())
                .collect();
            // The log first: what CI shows of a failure is the end of its message.
            format!(
                "{}\n{}\ndead workers never reaped: {zombies:?}",
                s.log(),
                statuses.join("\n")
            )
        },
    )
    .await;
    let status = s.stop();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn two_instances_never_share_worker_uids_and_a_taken_range_is_refused() {
    let a = Server::start_with(small(Options::default()).first_worker_only()).await;
    let b = Server::start_with(small(Options::default()).first_worker_only()).await;
    let (a_first, a_last) = uids(&a.health().await);
    let (b_first, b_last) = uids(&b.health().await);
    assert!(
        a_last < b_first || b_last < a_first,
        "{a_first}–{a_last} and {b_first}–{b_last} overlap"
    );
    let ua: u64 = stdout(&a.run("import os\nprint(os.getuid())").await)
        .trim()
        .parse()
        .unwrap();
    assert!(a_first < ua && ua <= a_last);

    // A range set by hand inside the one A holds (and no other's): start-up fails, naming
    // A.
    let state = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0"])
        .env("SNAKECAGE_WORKER__STATE_DIR", state.path())
        .env("SNAKECAGE_WORKSPACE__DIR", state.path())
        .env("SNAKECAGE_POOL__SIZE", "1")
        .env("SNAKECAGE_SESSIONS__MAX_SESSIONS", "1")
        .env("SNAKECAGE_SANDBOX__UID", (a_first + 5).to_string())
        .env("SNAKECAGE_SANDBOX__UID_COUNT", "50")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let wanted = format!(
        "worker uids {}–{} are claimed by another snakecage instance (pid {})",
        a_first + 5,
        a_first + 54,
        a.pid()
    );
    assert!(stderr.contains(&wanted), "{stderr}");
    assert!(stderr.contains("set sandbox.uid"), "{stderr}");
}

#[tokio::test]
async fn a_uid_range_too_small_or_out_of_bounds_is_refused_at_start_saying_what_to_set() {
    for (env, wanted) in [
        (
            vec![("SNAKECAGE_SANDBOX__UID_COUNT", "20")],
            "sandbox.uid_count is 20 but up to",
        ),
        (
            vec![("SNAKECAGE_SANDBOX__UID", "0")],
            "must not be 0 (root)",
        ),
        (
            vec![
                ("SNAKECAGE_SANDBOX__UID", "4294967200"),
                ("SNAKECAGE_SANDBOX__UID_COUNT", "200"),
            ],
            "runs past the largest uid",
        ),
        (
            vec![("SNAKECAGE_LIMITS__MAX_PROCESSES", "10")],
            "limits.max_processes is 10 but must be at least 24",
        ),
        // The configuration of the days when every worker ran as nobody.
        (
            vec![("SNAKECAGE_SANDBOX__UID", "65534")],
            "sandbox.uid = 65534: sandbox.uid no longer names the one uid every worker runs as (nobody); it is now the first id of a range of sandbox.uid_count ids, one per worker",
        ),
    ] {
        let state = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"));
        cmd.args(["--listen", "127.0.0.1:0"])
            .env("SNAKECAGE_WORKER__STATE_DIR", state.path());
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let stderr = refused_at_start(cmd);
        assert!(stderr.contains(wanted), "{env:?}: {stderr}");
    }
}

/// A range set by hand that holds an account's id (nobody's, 65534, on this host) stops
/// start-up naming the account and the key to change: no worker ever acts as an account.
#[tokio::test]
async fn a_uid_range_holding_an_accounts_id_is_refused_at_start_naming_it() {
    let stderr = refused_with_range(65_500, 64);
    assert!(
        stderr.contains("worker uids 65500–65563 (sandbox.uid, sandbox.uid_count) include ids of the system's accounts: 65534 (nobody);"),
        "{stderr}"
    );
    assert!(
        stderr.contains("set sandbox.uid to the first id of a range that holds no account's id"),
        "{stderr}"
    );
}

/// The default search passes over the ids the system names. Seen through a passwd file
/// of its own (bind-mounted in a mount namespace of the service's): an account in every
/// block of 64 of 40000–59999 but a few, so the only blocks left are those few.
#[tokio::test]
async fn an_unset_uid_range_passes_over_every_id_the_system_names() {
    let dir = tempfile::tempdir().unwrap();
    let free = [40_640u32, 45_056, 52_032];
    let mut passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let mut named = Vec::new();
    for block in (40_000u32..60_000).step_by(64) {
        if !free.contains(&block) {
            let uid = block + 5;
            passwd.push_str(&format!(
                "tenant-é{uid}:x:{uid}:{uid}::/nonexistent:/usr/sbin/nologin\n"
            ));
            named.push(uid);
        }
    }
    let file = dir.path().join("passwd");
    std::fs::write(&file, passwd).unwrap();
    let bind = format!("mount --bind {} /etc/passwd", file.display());
    let s = Server::start_with(
        tiny(small(Options::default()))
            .env("SNAKECAGE_SANDBOX__UID_COUNT", 64)
            .wrapper(&crate::harness::in_private_mounts(&bind)),
    )
    .await;
    let (first, last) = uids(&s.health().await);
    assert!(
        free.contains(&(first as u32)) && last == first + 63,
        "{first}–{last}: not one of the blocks that hold no account"
    );
    assert!(
        named
            .iter()
            .all(|&u| u64::from(u) < first || u64::from(u) > last)
    );
    let r = s.run("import os\nprint(os.getuid())").await;
    let uid: u64 = stdout(&r).trim().parse().unwrap();
    assert!(first < uid && uid <= last, "{r}");
    // The log says what was passed over.
    let log = s.log();
    assert!(
        log.contains("ids of the system's accounts were passed over")
            && log.contains("40005 (tenant-é40005)"),
        "{log}"
    );
}

/// A configured range nothing else uses (far above what the default search takes), for
/// the tests that start instances on it one after another.
fn configured(options: Options, first: u32) -> Options {
    tiny(small(options))
        .env("SNAKECAGE_SANDBOX__UID", first)
        .env("SNAKECAGE_SANDBOX__UID_COUNT", 64)
}

/// A process of the host's under a uid (a killed instance's worker, still going),
/// killed when dropped.
struct Leftover(std::process::Child);

impl Leftover {
    fn under(uid: u32) -> Self {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new("sleep")
            .arg("600")
            .uid(uid)
            .gid(65534)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Leftover {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An instance killed with its workers (the kernel lets its claim go at once; its
/// workers die with their zygote and wait to be reaped by whoever inherits them) and a
/// new one started at once on the same configured range: the new one's workers start
/// once the old ones are gone, so a tenant's thread bomb still gets every thread its
/// worker may have (not one less for each zombie that shared its uid).
#[tokio::test]
async fn an_instance_started_where_a_killed_one_ran_waits_for_its_workers_to_be_gone() {
    const FIRST: u32 = 3_200_000_000;
    let killed = Server::start_with(configured(Options::default(), FIRST)).await;
    let hog = killed.new_session().await;
    let r = killed.session_run(&hog, THREAD_HOG).await;
    assert_eq!(
        stdout(&r),
        format!("can't start new thread after {}\n", MAX_PROCESSES - 1),
        "{r}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let next = Server::start_with(configured(Options::default(), FIRST)).await;
    assert_eq!(
        uids(&next.health().await),
        (u64::from(FIRST), u64::from(FIRST) + 63)
    );
    let hog = next.new_session().await;
    let r = next.session_run(&hog, THREAD_HOG).await;
    assert_eq!(
        stdout(&r),
        format!("can't start new thread after {}\n", MAX_PROCESSES - 1),
        "{r}\n{}",
        next.log()
    );
    drop(killed);
}

/// A process under an id of the configured range holds the start-up back until it is
/// gone (the log names it), and one that stays makes the start-up fail, naming it.
#[tokio::test]
async fn a_configured_range_a_process_runs_under_is_waited_for_and_refused_if_it_stays() {
    const FIRST: u32 = 3_200_000_128;
    let leftover = Leftover::under(FIRST + 1);
    let pid = leftover.pid();
    let starting = tokio::spawn(Server::start_with(configured(Options::default(), FIRST)));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(!starting.is_finished(), "it served with the process there");
    drop(leftover);
    let s = starting.await.unwrap();
    let log = s.log();
    assert!(
        log.contains(&format!("pid {pid} (uid {}, sleep)", FIRST + 1))
            && log.contains("waiting for them to go"),
        "{log}"
    );
    let waited = log
        .lines()
        .filter(|l| l.contains("no process runs under the configured range any more"))
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v["fields"]["waited_ms"].as_u64())
        .unwrap_or_else(|| panic!("{log}"));
    assert!(waited >= 1000, "{waited} ms: {log}");
    let r = s.run("import os\nprint(os.getuid())").await;
    let uid: u64 = stdout(&r).trim().parse().unwrap();
    assert!(u64::from(FIRST) < uid && uid < u64::from(FIRST) + 64, "{r}");
    drop(s);

    let stays = Leftover::under(FIRST + 63);
    let stderr = refused_with_range(FIRST, 64);
    let wanted = format!(
        "worker uids {FIRST}–{} (sandbox.uid, sandbox.uid_count): processes still run under them after 10 s: pid {} (uid {}, sleep); a worker under one of these ids would share its process limit and the ownership of its files with such a process: stop them, or set sandbox.uid to the first id of a range no process runs under, or leave sandbox.uid unset to take a free block",
        FIRST + 63,
        stays.pid(),
        FIRST + 63
    );
    assert!(stderr.contains(&wanted), "{stderr}");
}

/// A process that stays under a worker's uid (a worker stuck in the kernel; here one of
/// the host's under the uid of a session's worker) keeps a stopped service from exiting
/// no longer than its patience for background work: it exits cleanly, naming the process.
#[tokio::test]
async fn a_stopped_service_exits_though_a_process_stays_under_a_workers_uid_and_names_it() {
    const FIRST: u32 = 3_200_000_256;
    let s = Server::start_with(configured(Options::default(), FIRST)).await;
    let id = s.new_session().await;
    let r = s.session_run(&id, "import os\nprint(os.getuid())").await;
    let uid: u32 = stdout(&r).trim().parse().unwrap();
    assert!((FIRST + 1..FIRST + 64).contains(&uid), "{r}");
    let stays = Leftover::under(uid);
    let (status, log) = s.stop_with_log();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(process_exists(stays.pid()), "the process went: {log}");
    let wanted = format!(
        "exiting without waiting any longer for worker uids to be free: processes still run under them: pid {} (uid {uid}, sleep); until they are gone, an instance with sandbox.uid unset passes over their block, and one with it set waits for them and then refuses to start",
        stays.pid()
    );
    assert!(log.contains(&wanted), "{log}");
}

/// The default search passes over a block a process runs under. Seen through a lock file
/// of its own (a tmpfs over its directory, in a mount namespace of the service's), where
/// no other instance holds a block: the first block is free to lock, but a process runs
/// under one of its ids, so the search takes another and the log names the process.
#[tokio::test]
async fn an_unset_uid_range_passes_over_a_block_a_process_runs_under() {
    let leftover = Leftover::under(40_001);
    let lock_dir = std::path::Path::new(snakecage::pool::uids::LOCK_FILE)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let s = Server::start_with(
        tiny(small(Options::default()))
            .env("SNAKECAGE_SANDBOX__UID_COUNT", 64)
            .wrapper(&crate::harness::in_private_mounts(&format!(
                "mkdir -p {lock_dir} && mount -t tmpfs none {lock_dir}"
            ))),
    )
    .await;
    let (first, last) = uids(&s.health().await);
    assert!(first >= 40_064 && last == first + 63, "{first}–{last}");
    let log = s.log();
    assert!(
        log.contains("blocks under whose ids processes run were passed over")
            && log.contains(&format!("pid {} (uid 40001, sleep)", leftover.pid())),
        "{log}"
    );
    let r = s.run("import os\nprint(os.getuid())").await;
    let uid: u64 = stdout(&r).trim().parse().unwrap();
    assert!(first < uid && uid <= last, "{r}");
}

/// The service started with worker uids `first` and on (`count`), which must refuse to
/// start: its stderr.
fn refused_with_range(first: u32, count: u32) -> String {
    let state = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"));
    cmd.args(["--listen", "127.0.0.1:0"])
        .env("SNAKECAGE_WORKER__STATE_DIR", state.path())
        .env("SNAKECAGE_WORKSPACE__DIR", state.path())
        .env("SNAKECAGE_POOL__SIZE", "1")
        .env("SNAKECAGE_SESSIONS__MAX_SESSIONS", "1")
        .env("SNAKECAGE_SANDBOX__UID", first.to_string())
        .env("SNAKECAGE_SANDBOX__UID_COUNT", count.to_string());
    refused_at_start(cmd)
}

/// Runs `cmd` (the service), which must refuse to start: its stderr. One that serves
/// instead is stopped once it says it listens, and the test fails.
fn refused_at_start(mut cmd: std::process::Command) -> String {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let mut started = false;
    for line in std::io::BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        started = line.contains("snakecage is listening");
        lines.push(line);
        if started {
            break;
        }
    }
    if started {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    let stderr = lines.join("\n");
    assert!(
        !started && !status.success(),
        "it started instead:\n{stderr}"
    );
    stderr
}
