//! While its zygotes start, the service answers at once: 503 `not_ready` with
//! `Retry-After` and what it is doing, never a hung connection (`/health` 200 `starting`,
//! for liveness probes); then it serves.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{
    Options, check_error_body, descendants_of, process_exists, repo_root, site_packages,
};

/// Makes `dir` (and a site-packages directory in it holding module `name` with `source`)
/// readable by the workers' uid, and returns the configuration of a tier `slow` that
/// preloads that module: a zygote whose start-up takes as long as `source` wants.
pub fn slow_tier(dir: &Path, name: &str, source: &str) -> String {
    let packages = site_packages(dir, &[(name, source)]);
    format!(
        "[python]\nsite_packages = [{:?}]\n\n[[tiers.profile]]\nname = \"slow\"\npreload = [{name:?}]\n",
        packages.display().to_string()
    )
}

/// Starts the service (pool size 1, its state in `dir`) with one tier, `slow_tier`'s, on a
/// free port: stopped when the returned guard is dropped.
fn start_slow(dir: &Path, name: &str, source: &str) -> (Stop, u16) {
    let config = dir.join("snakecage.toml");
    std::fs::write(&config, slow_tier(dir, name, source)).unwrap();
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&config)
        .arg("--venv")
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", &state)
        .env("SNAKECAGE_WORKSPACE__DIR", &state)
        .env("SNAKECAGE_POOL__SIZE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Stop(child), port)
}

#[tokio::test]
async fn requests_during_start_up_get_a_friendly_503_then_are_served() {
    let dir = tempfile::tempdir().unwrap();
    // A tier whose preload takes seconds: the start-up window is long enough to be seen.
    let (_stopped, port) = start_slow(
        dir.path(),
        "snakecage_slow_import",
        "import time\ntime.sleep(3)\n",
    );
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/v1/execute");
    let body = serde_json::json!({ "code": "print('ready')" });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut starting = None;
    let mut saw_health_starting = false;
    let health_url = format!("http://127.0.0.1:{port}/health");
    let served = loop {
        assert!(Instant::now() < deadline, "the service never served a run");
        let response = match client.post(&url).json(&body).send().await {
            Ok(response) => response,
            Err(_) => {
                // Not bound yet.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let status = response.status().as_u16();
        let retry_after = response.headers().get("retry-after").cloned();
        let answer: Value = response.json().await.unwrap();
        if status == 200 {
            break answer;
        }
        assert_eq!(status, 503, "{answer}");
        check_error_body(status, &answer);
        assert_eq!(answer["code"], "not_ready", "{answer}");
        assert!(retry_after.is_some(), "a 503 without Retry-After: {answer}");
        starting.get_or_insert(answer);
        // The process is alive: liveness probes get 200 while it starts.
        if let Ok(health) = client.get(&health_url).send().await {
            let status = health.status().as_u16();
            let health: Value = health.json().await.unwrap();
            if health["status"] == "starting" {
                assert_eq!(status, 200, "{health}");
                assert_eq!(health["ready"], false, "{health}");
                assert_eq!(health["pool"]["idle"], 0, "{health}");
                saw_health_starting = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let starting = starting.expect("no request was answered before the pool was ready");
    assert!(
        saw_health_starting,
        "/health never said the service was starting"
    );
    let detail = starting["detail"].as_str().unwrap();
    assert!(
        detail.contains("starting") && detail.contains("slow") && detail.contains("preloading"),
        "{detail}"
    );
    assert_eq!(served["stdout"], "ready\n", "{served}");
}

/// The file store is opened while the zygotes start, behind a listener that answers: a
/// local store reads its whole index first (seconds with a million files), and a liveness
/// probe that found no listener meanwhile would kill the service over and over. A
/// metadata entry whose read blocks (a FIFO with no writer yet) holds the index's load for
/// as long as the test wants.
#[tokio::test]
async fn the_service_answers_starting_while_its_file_store_loads_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join("state").join("files").join("meta");
    std::fs::create_dir_all(&meta).unwrap();
    let held = meta.join("tenu.json");
    nix::unistd::mkfifo(&held, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (_stopped, port) = start_slow(dir.path(), "snakecage_quick", "");
    // The port is bound before the service starts: a connection nothing answers waits.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let get = async |path: &str| {
        let response = client
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.json::<Value>().await.unwrap()))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (status, health) = loop {
        if let Some(answer) = get("/health").await {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "nothing answered while the index loads"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (status, &health["status"]),
        (200, &json!("starting")),
        "{health}"
    );
    let (status, ready) = get("/ready").await.unwrap();
    assert_eq!(status, 503, "{ready}");
    // The index's read goes on: the entry holds no metadata, so it is dropped, and the
    // service serves.
    tokio::task::spawn_blocking(move || std::fs::write(&held, b"pas du json"))
        .await
        .unwrap()
        .unwrap();
    loop {
        if get("/ready").await.is_some_and(|(status, _)| status == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never ready once the index loaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!meta.join("tenu.json").exists());
}

/// The zygote `/ready` waits for, the lightest, and the one that takes longest, the fullest,
/// prepare at the service's own priority; every one between at nice 10, so that on a small
/// machine they do not take those two's CPU. A preloaded module records the niceness its
/// zygote imported it at, and a job on each tier reads it.
#[tokio::test]
async fn zygotes_between_the_lightest_and_the_fullest_prepare_at_a_lower_priority() {
    let dir = tempfile::tempdir().unwrap();
    let packages = site_packages(
        dir.path(),
        &[
            (
                "snakecage_niceness",
                "import os\nNICE = os.getpriority(os.PRIO_PROCESS, 0)\n",
            ),
            ("snakecage_middle", "MILIEU = 'milieu'\n"),
            ("snakecage_fuller", "ÉTÉ = 'été'\n"),
        ],
    );
    let config = dir.path().join("snakecage.toml");
    std::fs::write(
        &config,
        format!(
            "[python]\nsite_packages = [{:?}]\n\n[sandbox]\nallowed_packages = [\"snakecage_niceness\", \"snakecage_middle\", \"snakecage_fuller\"]\n\n\
             [[tiers.profile]]\nname = \"light\"\npreload = [\"snakecage_niceness\"]\n\n\
             [[tiers.profile]]\nname = \"middle\"\npreload = [\"snakecage_niceness\", \"snakecage_middle\"]\n\n\
             [[tiers.profile]]\nname = \"full\"\npreload = [\"snakecage_niceness\", \"snakecage_middle\", \"snakecage_fuller\"]\n",
            packages.display().to_string()
        ),
    )
    .unwrap();
    let s = crate::rollover::start(&config, Options::default()).await;
    // The service inherits this process's niceness; the lightest and fullest zygotes keep
    // it.
    // SAFETY: getpriority of this process; errno is not needed (a niceness of -1 is
    // still compared as a value).
    let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };

    let light = s
        .run("import snakecage_niceness\nprint(snakecage_niceness.NICE)")
        .await;
    assert_eq!(light["stdout"], format!("{own}\n"), "{light}");
    let middle = s
        .run("import snakecage_niceness, snakecage_middle\nprint(snakecage_niceness.NICE, snakecage_middle.MILIEU)")
        .await;
    assert_eq!(middle["stdout"], "10 milieu\n", "{middle}");
    let full = s
        .run("import snakecage_niceness, snakecage_fuller\nprint(snakecage_niceness.NICE, snakecage_fuller.ÉTÉ)")
        .await;
    assert_eq!(full["stdout"], format!("{own} été\n"), "{full}");
}

/// A SIGTERM while the zygotes start (minutes, with big preloads) stops the service in
/// order: it exits with success (not killed by the signal, and not carrying on: as PID 1 of
/// a container the kernel would discard a signal it has no handler for yet), promptly, and
/// leaves no zygote and no workspace root behind.
#[tokio::test]
async fn sigterm_during_start_up_stops_the_service_at_once_and_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    // Far longer than the test waits: only the SIGTERM can end this start-up in time.
    let (mut service, port) = start_slow(
        dir.path(),
        "snakecage_endless_import",
        "import time\ntime.sleep(300)\n",
    );
    let pid = service.0.id();
    // Starting: the listener answers `starting` and the zygote is preloading.
    let client = reqwest::Client::new();
    let health_url = format!("http://127.0.0.1:{port}/health");
    let deadline = Instant::now() + Duration::from_secs(60);
    let family = loop {
        assert!(
            Instant::now() < deadline,
            "the service never said it was starting"
        );
        if let Ok(r) = client.get(&health_url).send().await
            && r.json::<Value>().await.unwrap()["status"] == "starting"
        {
            let family = descendants_of(pid);
            if !family.is_empty() {
                break family;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let signalled = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = loop {
        if let Some(status) = service.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(60),
            "still running 60 s after SIGTERM during start-up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "not stopped in order: {status:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while family.iter().any(|&p| process_exists(p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left: Vec<u32> = family.into_iter().filter(|&p| process_exists(p)).collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    // Nor its workspace root.
    assert_eq!(
        workspace_roots(&dir.path().join("state")),
        Vec::<String>::new()
    );
}

/// Stops the service when the test ends, passed or failed: SIGTERM, then SIGKILL if it is
/// still running 30 s later (a service that ignores SIGTERM must fail a test, not hang it).
struct Stop(std::process::Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The names under `dir` that are workspace roots (`workspaces-<pid>`).
fn workspace_roots(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("workspaces-"))
        .collect()
}

/// A start-up that fails once its workspace root is claimed (here: the zygote binary is
/// missing) says why and removes the root, as a shutdown does: nothing is left for the
/// next start to clean up.
#[test]
fn a_failed_start_up_leaves_no_workspace_root() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("bin-ünknown").join("snakecage-worker");
    let output = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0"])
        .arg("--venv")
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", dir.path())
        .env("SNAKECAGE_WORKSPACE__DIR", dir.path())
        .env("SNAKECAGE_WORKER__BINARY", &missing)
        .env("SNAKECAGE_POOL__SIZE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started without a worker binary");
    assert!(
        log.contains(&missing.display().to_string()),
        "the error does not name the missing binary: {log}"
    );
    assert_eq!(workspace_roots(dir.path()), Vec::<String>::new(), "{log}");
}
