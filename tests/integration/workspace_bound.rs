//! The instance's workspace bound: its own tmpfs over its workspace root, sized by
//! `workspace.size_mb`; what a job that writes past it gets, what other tenants get while
//! it is full (a 503 that blames the service, not them; `/health` degraded), two
//! instances on one base, and the mount a SIGKILLed instance leaves behind (mounting needs
//! root: without it those tests are skipped); and a session's own bound, checked after each
//! of its runs.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::files::{download_bytes, upload};
use crate::harness::{Options, Server};
use crate::observability::{chromium, dom_value};
use crate::reliability::{eventually, until};

const MIB: u64 = 1 << 20;

/// The mount points (as this process's namespace lists them) at or below `under`.
fn mounts_under(under: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(under))
        .collect()
}

fn root_of(base: &Path, s: &Server) -> PathBuf {
    base.join(format!("workspaces-{}", s.pid()))
}

/// The deadline of the runs that write: tens of MiB take seconds of CPU on a busy host,
/// and what these tests check is where the writes end, not how fast they go.
const WRITE_TIMEOUT_MS: u64 = 60_000;

/// Runs `code` in session `id` under [`WRITE_TIMEOUT_MS`]; the response must be a 200.
async fn session_write(s: &Server, id: &str, code: &str) -> Value {
    let body = json!({"code": code, "timeout_ms": WRITE_TIMEOUT_MS});
    let (status, r) = s.post(&format!("/v1/sessions/{id}/execute"), &body).await;
    assert_eq!(status, 200, "{r}");
    r
}

/// Runs `code` statelessly under [`WRITE_TIMEOUT_MS`].
async fn write(s: &Server, code: &str) -> Value {
    s.run_with(json!({"code": code, "timeout_ms": WRITE_TIMEOUT_MS}))
        .await
}

fn bounded(size_mb: u64) -> Options {
    Options::default().env("SNAKECAGE_WORKSPACE__SIZE_MB", size_mb)
}

#[tokio::test]
async fn a_job_writing_past_the_bound_gets_enospc_and_others_are_told_the_service_is_full() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let s = Server::start_with(bounded(64)).await;
    let root = root_of(s.state_dir(), &s);
    assert_eq!(mounts_under(&root), vec![root.join("mount")]);
    let health = s.health().await;
    let ws = &health["workspace"];
    assert_eq!(ws["bounded"], true, "{health}");
    assert_eq!(ws["size_bytes"], 64 * MIB, "{health}");
    assert_eq!(health["status"], "ok", "{health}");

    // One job cannot write more than the bound, however long its deadline.
    let r = write(
        &s,
        "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (100 << 20))",
    )
    .await;
    assert_eq!(r["verdict"], "error", "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("No space left"),
        "{r}"
    );
    // What it wrote is gone by the time its client has the answer: the next job has the
    // whole bound again.
    let health = s.health().await;
    assert!(
        health["workspace"]["used_bytes"].as_u64().unwrap() < MIB,
        "{health}"
    );

    // Sessions that hold most of it, each within its bound (a quarter of the 64 MiB): the
    // service says it is nearly full.
    let mut sessions = Vec::new();
    for _ in 0..4 {
        let id = s.new_session().await;
        let r = session_write(&s, &id, "open('hold.bin', 'wb').write(b'x' * (15 << 20))").await;
        assert_eq!(r["verdict"], "ok", "{r}");
        assert!(r["notice"].is_null(), "{r}");
        sessions.push(id);
    }
    let health = s.health().await;
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["workspace"]["nearly_full"], true, "{health}");
    // The status page says so too, in red, with the numbers.
    let dom = chromium(
        &["--virtual-time-budget=5000", "--dump-dom"],
        &format!("{}/", s.base),
    );
    assert_eq!(dom_value(&dom, "ws-nearly-full"), "true");
    assert!(
        dom.contains("id=\"ws-nearly-full\" data-value=\"true\" class=\"bad\""),
        "{dom}"
    );
    assert_eq!(dom_value(&dom, "ws-bounded"), "true");
    assert_eq!(dom_value(&dom, "ws-size-bytes"), (64 * MIB).to_string());
    let used: u64 = dom_value(&dom, "ws-used-bytes").parse().unwrap();
    assert!(used >= 60 * MIB, "{used}");
    assert!(
        health["workspace"]["used_bytes"].as_u64().unwrap() >= 60 * MIB,
        "{health}"
    );
    let (_, _, metrics) = s.get("/metrics").await;
    assert!(
        metrics.contains("snakecage_workspace_bounded 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("snakecage_workspace_size_bytes {}", 64 * MIB)),
        "{metrics}"
    );

    // Another tenant's staged file does not fit: the service's condition, retry later.
    let file = upload(&s, "in.bin", vec![7u8; 10 << 20]).await;
    let body = json!({
        "code": "import os\nprint(os.path.getsize('in.bin'))",
        "files": [{"path": "in.bin", "file_id": file["file_id"]}],
        "timeout_ms": WRITE_TIMEOUT_MS,
    });
    let resp = s.post_response("/v1/execute", &body).await;
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").cloned();
    let refused: Value = resp.json().await.unwrap();
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["code"], "unavailable", "{refused}");
    assert!(retry.is_some(), "503 without Retry-After: {refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("the service's workspace space is exhausted")
            && detail.contains("retry later"),
        "{refused}"
    );

    // Once the space is given back, the same request works and the service is healthy.
    for id in sessions {
        let deleted = s
            .client
            .delete(format!("{}/v1/sessions/{id}", s.base))
            .send()
            .await
            .unwrap();
        assert!(deleted.status().is_success(), "{}", deleted.status());
    }
    until(
        std::time::Instant::now() + std::time::Duration::from_secs(30),
        async || {
            let health = s.health().await;
            if health["status"] == "ok" {
                Ok(())
            } else {
                Err(health)
            }
        },
        |health| {
            let left = std::process::Command::new("du")
                .args(["-a", "-k"])
                .arg(root.join("mount"))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            // The log first: what CI shows of a failure is the end of its message.
            format!(
                "{}\nin the workspaces (KiB):\n{left}\nstill not healthy 30 s after the sessions were deleted: {health}",
                s.log()
            )
        },
    )
    .await;
    let r = s.run_with(body).await;
    assert_eq!(r["stdout"], format!("{}\n", 10 * MIB), "{r}");
    drop(s);
    assert!(
        mounts_under(&root).is_empty(),
        "the mount outlived its instance"
    );
}

#[tokio::test]
async fn two_instances_on_one_base_are_bounded_apart_and_a_killed_ones_mount_goes_next_start() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    // Workers (another uid) reach their workspace by its path through the base.
    std::fs::set_permissions(
        base.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let on_base = |size_mb| bounded(size_mb).env("SNAKECAGE_WORKSPACE__DIR", base.path().display());
    let a = Server::start_with(on_base(32)).await;
    let b = Server::start_with(on_base(48)).await;
    let (a_root, b_root) = (root_of(base.path(), &a), root_of(base.path(), &b));
    assert_eq!(mounts_under(&a_root), vec![a_root.join("mount")]);
    assert_eq!(mounts_under(&b_root), vec![b_root.join("mount")]);
    assert_eq!(a.health().await["workspace"]["size_bytes"], 32 * MIB);
    assert_eq!(b.health().await["workspace"]["size_bytes"], 48 * MIB);

    // What A holds is A's alone: B's file system stays empty.
    let id = a.new_session().await;
    let r = session_write(&a, &id, "open('hold.bin', 'wb').write(b'x' * (6 << 20))").await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert!(
        a.health().await["workspace"]["used_bytes"]
            .as_u64()
            .unwrap()
            >= 6 * MIB
    );
    assert!(
        b.health().await["workspace"]["used_bytes"]
            .as_u64()
            .unwrap()
            < MIB
    );

    // A dies without shutting down: its mount (and the 6 MiB in it) stays...
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = a.stop();
    assert_eq!(mounts_under(&a_root), vec![a_root.join("mount")]);
    // ...until the next instance on the base starts: it unmounts and removes A's root,
    // and leaves B's, alive, alone.
    let c = Server::start_with(on_base(16)).await;
    assert!(
        mounts_under(&a_root).is_empty(),
        "A's stale mount is still there"
    );
    assert!(!a_root.exists());
    assert_eq!(mounts_under(&b_root), vec![b_root.join("mount")]);
    assert_eq!(b.run("print('b')").await["stdout"], "b\n");
    assert_eq!(c.run("print('c')").await["stdout"], "c\n");
    let c_root = root_of(base.path(), &c);
    drop(b);
    drop(c);
    assert!(mounts_under(&b_root).is_empty() && mounts_under(&c_root).is_empty());
}

#[tokio::test]
async fn without_the_mount_the_workspaces_are_unbounded_and_health_says_so() {
    let s = Server::start_with(Options::default().env("SNAKECAGE_WORKSPACE__MOUNT", "false")).await;
    let root = root_of(s.state_dir(), &s);
    assert!(mounts_under(&root).is_empty());
    let health = s.health().await;
    let ws = &health["workspace"];
    assert_eq!(ws["bounded"], false, "{health}");
    assert_eq!(
        ws["unbounded_because"], "workspace.mount is false",
        "{health}"
    );
    assert!(ws["size_bytes"].as_u64().unwrap() > 0, "{health}");
    let (_, _, metrics) = s.get("/metrics").await;
    assert!(
        metrics.contains("snakecage_workspace_bounded 0"),
        "{metrics}"
    );
    assert_eq!(s.run("print(1)").await["stdout"], "1\n");
}

#[tokio::test]
async fn a_session_whose_workspace_grows_past_its_bound_is_ended_and_its_files_are_kept() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SESSIONS__MAX_WORKSPACE_MB", 8)).await;
    let id = s.new_session().await;
    // Counted as allocated: a sparse file of 20 MiB (past the bound in length) costs
    // (almost) nothing.
    let r = session_write(
        &s,
        &id,
        "with open('sparse.bin', 'wb') as f:\n    f.truncate(20 << 20)\nx = 1",
    )
    .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert!(r["notice"].is_null(), "{r}");
    assert_eq!(r["session"]["names"], json!(["f", "x"]), "{r}");

    // Past the bound: the run is answered, its file stored, and the session ended.
    let r = session_write(&s, &id, "open('data.bin', 'wb').write(b'd' * (10 << 20))").await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let notice = r["notice"].as_str().unwrap_or_default();
    assert!(
        notice.contains("over the 8 MiB") && notice.contains("sessions.max_workspace_mb"),
        "{r}"
    );
    assert!(notice.contains("Start a new session"), "{r}");
    let data = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "data.bin")
        .unwrap_or_else(|| panic!("data.bin not stored: {r}"));
    let stored = download_bytes(&s, data["file_id"].as_str().unwrap()).await;
    assert_eq!(stored.len(), 10 << 20);
    let (status, body) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "print(x)"}),
        )
        .await;
    assert_eq!(status, 410, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("sessions.max_workspace_mb"),
        "{body}"
    );
    // A new session works.
    let id = s.new_session().await;
    assert_eq!(s.session_run(&id, "print(2)").await["stdout"], "2\n");
}

#[tokio::test]
async fn a_session_may_hold_at_most_a_quarter_of_the_instance_bound() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    // sessions.max_workspace_mb (1024) is more than the whole bound: a quarter of it wins.
    let s = Server::start_with(bounded(40)).await;
    let id = s.new_session().await;
    let r = session_write(&s, &id, "open('hold.bin', 'wb').write(b'x' * (12 << 20))").await;
    assert_eq!(r["verdict"], "ok", "{r}");
    let notice = r["notice"].as_str().unwrap_or_default();
    assert!(notice.contains("over the 10 MiB"), "{r}");
    eventually(30, "the ended session's space given back", async || {
        s.health().await["workspace"]["used_bytes"]
            .as_u64()
            .unwrap()
            < MIB
    })
    .await;
}

/// A text file written on a full workspace and never closed: the `ENOSPC` comes from its
/// finaliser, which CPython 3.12 silences (3.13 reports it). The run's stderr says it as
/// 3.13 does, so the program that ends `ok` with an empty file says why; a file closed
/// with `with` raises as ever.
#[tokio::test]
async fn a_write_lost_to_a_full_workspace_in_a_finaliser_is_reported_on_stderr() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let s = Server::start_with(bounded(16)).await;
    let code = "try:\n    open('fill.bin', 'wb').write(b'x' * (32 << 20))\nexcept OSError as e:\n    \
                print('filled:', e.strerror)\nopen('résultat.txt', 'w').write('hé')\n\
                import os\nprint(os.path.getsize('résultat.txt'))\n\
                with open('autre.txt', 'w') as f:\n    f.write('hé')";
    let r = write(&s, code).await;
    assert_eq!(r["stdout"], "filled: No space left on device\n0\n", "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with(
            "Exception ignored in: <_io.TextIOWrapper name='résultat.txt' mode='w' \
             encoding='utf-8'>\nOSError: [Errno 28] No space left on device\n"
        ),
        "{stderr}"
    );
    assert!(
        stderr.ends_with("OSError: [Errno 28] No space left on device\n"),
        "{stderr}"
    );
    assert_eq!(r["error"]["type"], "OSError", "{r}");
    assert_eq!(r["verdict"], "error", "{r}");
}

/// The bound taken from under a running instance (its tmpfs unmounted, then its root
/// removed): `/health` turns degraded saying the workspaces are no longer bounded and why, instead of reporting a bound that is gone (before, it said
/// `bounded: true` and `ok` on the base file system).
#[tokio::test]
async fn a_bound_lost_under_a_running_instance_turns_health_degraded_saying_why() {
    let s = Server::start_with(bounded(64)).await;
    let root = root_of(s.state_dir(), &s);
    let mount = root.join("mount");
    if mounts_under(&root) != [mount.clone()] {
        eprintln!("skipped: the service could not mount its tmpfs here");
        return;
    }
    let health = s.health().await;
    assert_eq!(
        (&health["status"], &health["workspace"]["bounded"]),
        (&json!("ok"), &json!(true)),
        "{health}"
    );
    // Unmounted under it: the workspaces now live on the base file system.
    nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
    // A job (whether a worker can still be started: what is asserted is what /health says).
    let _ = s.post("/v1/execute", &json!({"code": "print('là')"})).await;
    let health = s.health().await;
    let ws = &health["workspace"];
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(ws["bounded"], false, "{health}");
    assert_eq!(ws["bound_lost"], true, "{health}");
    let why = ws["unbounded_because"].as_str().unwrap_or_default();
    assert!(
        why.contains("was unmounted under the service")
            && why.contains("restart the service to bound them again"),
        "{health}"
    );
    // Then the root removed as well: recreated for the next workers, still degraded, the
    // first cause kept.
    std::fs::remove_dir_all(&root).unwrap();
    // A job takes an idle worker; the refill finds the root gone and recreates it. (The
    // running zygotes' workers may not be able to use the recreated root: what is asserted
    // is what /health says of the bound.)
    eventually(30, "the root is recreated", async || {
        let _ = s
            .post("/v1/execute", &json!({"code": "print('encore')"}))
            .await;
        root.join("mount").is_dir()
    })
    .await;
    let health = s.health().await;
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["workspace"]["bound_lost"], true, "{health}");
    assert!(
        health["workspace"]["unbounded_because"]
            .as_str()
            .is_some_and(|why| why.contains("was unmounted under the service")),
        "{health}"
    );
    let (_, _, metrics) = s.get("/metrics").await;
    assert!(
        metrics.contains("snakecage_workspace_bounded 0"),
        "{metrics}"
    );
}

/// The root removed (after a lazy unmount, with no look at `/health` in between): it is
/// recreated for the next workers, and `/health` says the bound did not come back.
#[tokio::test]
async fn a_workspace_root_removed_under_a_running_instance_comes_back_reported_unbounded() {
    let s = Server::start_with(bounded(64)).await;
    let root = root_of(s.state_dir(), &s);
    let mount = root.join("mount");
    if mounts_under(&root) != [mount.clone()] {
        eprintln!("skipped: the service could not mount its tmpfs here");
        return;
    }
    nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
    std::fs::remove_dir_all(&root).unwrap();
    // A job takes an idle worker; the refill finds the root gone and recreates it. (The
    // running zygotes' workers may not be able to use the recreated root: what is asserted
    // is what /health says of the bound.)
    eventually(30, "the root is recreated", async || {
        let _ = s
            .post("/v1/execute", &json!({"code": "print('encore')"}))
            .await;
        root.join("mount").is_dir()
    })
    .await;
    let health = s.health().await;
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["workspace"]["bounded"], false, "{health}");
    assert_eq!(health["workspace"]["bound_lost"], true, "{health}");
}
