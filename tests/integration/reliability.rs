//! Ordinary input a user meets on day one: non-ASCII everywhere (UTF-8 mode), over-long
//! and illegal paths (422 with the limit, Onyx's wording), two instances on one host, and a
//! health that says when workers cannot be started.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::files::{download_bytes, list, try_upload, upload};
use crate::harness::{Options, Server};
use crate::stream::stream;

const TEXT: &str = "héllo ✓ 日本";

#[tokio::test]
async fn workers_run_in_utf8_mode_for_code_output_stdin_and_file_names() {
    let s = Server::start().await;
    let input = upload(&s, "données ✓.csv", "é,日本\n".as_bytes().to_vec()).await;
    let code = format!(
        "import sys\n\
         print({TEXT:?}, sys.stdout.encoding, sys.stderr.encoding, sys.getfilesystemencoding(), sys.flags.utf8_mode)\n\
         print('ünïcode err', file=sys.stderr)\n\
         print(open('entrée/données ✓.csv').read().strip(), input())\n\
         n = open('résultat_日本.txt', 'w').write({TEXT:?})\n"
    );
    let r = s
        .run_with(json!({
            "code": code,
            "stdin": "ß✓",
            "files": [{"path": "entrée/données ✓.csv", "file_id": input["file_id"]}],
        }))
        .await;
    assert_eq!(r["verdict"], "ok", "{r}");
    assert_eq!(
        r["stdout"],
        format!("{TEXT} utf-8 utf-8 utf-8 1\né,日本 ß✓\n"),
        "{r}"
    );
    assert_eq!(r["stderr"], "ünïcode err\n");
    let files = r["files"].as_array().unwrap();
    let out = files
        .iter()
        .find(|f| f["path"] == "résultat_日本.txt")
        .unwrap_or_else(|| panic!("the non-ASCII file was not collected: {r}"));
    let bytes = download_bytes(&s, out["file_id"].as_str().unwrap()).await;
    assert_eq!(bytes, TEXT.as_bytes());
    let listed = list(&s).await;
    assert!(
        listed.iter().any(|f| f["filename"] == "résultat_日本.txt"),
        "{listed:?}"
    );

    // Streamed: the output events carry the characters, not an encoding error.
    let events = stream(
        &s,
        "/v1/execute/stream",
        json!({ "code": format!("print({TEXT:?})") }),
    )
    .await;
    let result = events.iter().find(|e| e.event == "result").unwrap();
    assert_eq!(result.data["stdout"], format!("{TEXT}\n"), "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e.event == "output" && e.data["data"] == format!("{TEXT}\n")),
        "{events:?}"
    );

    // And in a session.
    let (status, created) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["session_id"].as_str().unwrap();
    let path = format!("/v1/sessions/{id}/execute");
    let (status, r) = s
        .post(&path, &json!({ "code": format!("x = {TEXT:?}\nprint(x)") }))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], format!("{TEXT}\n"), "{r}");
    let (_, r) = s
        .post(
            &path,
            &json!({ "code": "open('ß.txt','w').write(x)\nprint(input())", "stdin": "日本" }),
        )
        .await;
    assert_eq!(r["stdout"], "日本\n", "{r}");
    assert!(
        r["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "ß.txt"),
        "{r}"
    );
}

/// What a request with a bad `files[].path` must answer: 422 and a detail saying what.
async fn refused(s: &Server, path: &str, body: &Value) -> String {
    let (status, r) = s.post(path, body).await;
    assert_eq!(status, 422, "{path}: {r}");
    r["detail"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn over_long_paths_are_422_naming_the_limit_and_nothing_stored_is_touched() {
    let s = Server::start().await;
    let stored = upload(&s, "in.txt", b"keep me".to_vec()).await;
    let id = stored["file_id"].as_str().unwrap();
    let before = list(&s).await;
    let cases = [
        ("a".repeat(10_000), "PATH_MAX"),
        (format!("dir/{}", "b".repeat(300)), "NAME_MAX"),
        ("日".repeat(100), "NAME_MAX"),
    ];
    for (path, limit) in &cases {
        let files = json!([{ "path": path, "file_id": id }]);
        for endpoint in ["/v1/execute", "/v1/execute/stream", "/v1/sessions"] {
            let body = if endpoint == "/v1/sessions" {
                json!({ "files": files })
            } else {
                json!({ "code": "print(1)", "files": files })
            };
            let detail = refused(&s, endpoint, &body).await;
            assert!(detail.contains(limit), "{endpoint}: {detail}");
            assert!(detail.len() < 400, "the path is echoed whole: {detail}");
        }
        let detail = refused(
            &s,
            "/v1/execute",
            &json!({ "entrypoint": path, "files": [{"path": "x.py", "file_id": id}] }),
        )
        .await;
        assert!(detail.contains(limit), "{detail}");
    }
    // A session's own staging too.
    let (status, created) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["session_id"].as_str().unwrap();
    let detail = refused(
        &s,
        &format!("/v1/sessions/{sid}/execute"),
        &json!({ "code": "1", "files": [{"path": "c".repeat(256), "file_id": id}] }),
    )
    .await;
    assert!(detail.contains("NAME_MAX"), "{detail}");
    // An upload's name is the client's business: cut to a file name, never a 500.
    let (status, r) = try_upload(&s, &"n".repeat(300), b"long name".to_vec()).await;
    assert_eq!(status, 201, "{r}");
    assert!(r["filename"].as_str().unwrap().len() <= 255, "{r}");
    // Nothing stored was touched.
    let after = list(&s).await;
    assert!(
        before.iter().all(|f| after.contains(f)),
        "{before:?} {after:?}"
    );
    assert_eq!(download_bytes(&s, id).await, b"keep me");
    // A job that makes a path beyond PATH_MAX inside its workspace gets a skipped entry,
    // not a failed request.
    let deep = "import os\nfor _ in range(25):\n    os.mkdir('d' * 200)\n    os.chdir('d' * 200)\n";
    let (status, r) = s.post("/v1/execute", &json!({ "code": deep })).await;
    assert_eq!(status, 200);
    assert_eq!(r["verdict"], "ok", "{}", r["stderr"]);
    let skipped = r["skipped_files"].as_array().unwrap();
    assert!(
        skipped
            .iter()
            .any(|f| f["reason"].as_str().unwrap().contains("too long")),
        "{skipped:?}"
    );
}

#[tokio::test]
async fn illegal_staging_paths_are_refused_in_onyx_words() {
    let s = Server::start().await;
    let stored = upload(&s, "in.txt", b"x".to_vec()).await;
    let id = &stored["file_id"];
    let cases = [
        ("/etc/passwd", "File paths must be relative."),
        ("../x", "File paths must not contain '..'."),
        ("a/../../x", "File paths must not contain '..'."),
    ];
    for (path, words) in cases {
        for endpoint in ["/v1/execute", "/v1/execute/stream"] {
            let body = json!({ "code": "1", "files": [{"path": path, "file_id": id}] });
            let detail = refused(&s, endpoint, &body).await;
            assert!(detail.starts_with(words), "{path}: {detail}");
        }
    }
}

/// Waits until `check` holds, for at most `secs` seconds.
pub async fn eventually(secs: u64, what: &str, mut check: impl AsyncFnMut() -> bool) {
    until(
        Instant::now() + Duration::from_secs(secs),
        async || if check().await { Ok(()) } else { Err(()) },
        |()| format!("never happened: {what}"),
    )
    .await;
}

/// Waits until `check` gives `Ok`, up to `deadline`; past it, fails with what `explain`
/// makes of the last `Err` (called once: it may gather what only a failure needs).
pub async fn until<E>(
    deadline: Instant,
    mut check: impl AsyncFnMut() -> Result<(), E>,
    explain: impl FnOnce(E) -> String,
) {
    loop {
        let Err(seen) = check().await else {
            return;
        };
        if Instant::now() >= deadline {
            panic!("{}", explain(seen));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The workspace root a test server with workspaces in its state dir uses.
pub fn workspace_root(s: &Server) -> std::path::PathBuf {
    s.state_dir().join(format!("workspaces-{}", s.pid()))
}

/// The directory its workspaces are made in: the root's `mount` (the instance's tmpfs).
pub fn workspaces_dir(s: &Server) -> std::path::PathBuf {
    workspace_root(s).join("mount")
}

/// Detaches the instance's tmpfs from `root`, as a test that removes the root must first
/// (a mount point cannot be removed); nothing where none is mounted.
pub fn detach_workspaces(root: &std::path::Path) {
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(root.join("mount"))
        .stderr(std::process::Stdio::null())
        .status();
}

#[tokio::test]
async fn while_workers_cannot_start_health_says_so_requests_get_503_and_it_recovers() {
    let s = Server::start().await;
    assert_eq!(s.run("print(1)").await["verdict"], "ok");
    let root = workspace_root(&s);
    assert!(root.is_dir(), "{}", root.display());
    // A file where the workspace root was: no workspace can be made until it goes.
    detach_workspaces(&root);
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, "in the way").unwrap();

    let mut verdicts = Vec::new();
    eventually(30, "a 503 with Retry-After", async || {
        let resp = s
            .client
            .post(format!("{}/v1/execute", s.base))
            .json(&json!({"code": "print(1)"}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let retry = resp.headers().get("retry-after").cloned();
        let body: Value = resp.json().await.unwrap();
        if status == 200 {
            verdicts.push(body["verdict"].clone());
            return false;
        }
        assert_eq!(status, 503, "{body}");
        assert!(retry.is_some(), "503 without Retry-After: {body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("workers cannot be started"),
            "{body}"
        );
        true
    })
    .await;
    // No fake verdict for a worker that could never have run the job.
    assert!(
        verdicts.iter().all(|v| v == "ok"),
        "a request answered 200 with {verdicts:?}"
    );
    let (status, _, body) = s.get("/ready").await;
    assert_eq!(status, 503, "{body}");
    let health = s.health().await;
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(health["last_spawn_error"].is_string(), "{health}");

    // The cause goes away: everything comes back by itself.
    std::fs::remove_file(&root).unwrap();
    eventually(30, "/ready is 200 again", async || {
        s.get("/ready").await.0 == 200
    })
    .await;
    assert_eq!(s.run("print(2)").await["stdout"], "2\n");
    let health = s.health().await;
    assert!(health["last_spawn_error"].is_null(), "{health}");
    // Recreated as a plain directory (the zygotes' namespaces would not see a new mount),
    // which health tells: degraded for the bound lost (where there was one), until a
    // restart.
    assert_eq!(health["workspace"]["bounded"], false, "{health}");
    let lost = health["workspace"]["bound_lost"] == true;
    assert_eq!(
        health["status"],
        if lost { "degraded" } else { "ok" },
        "{health}"
    );
    assert!(
        health["workspace"]["unbounded_because"]
            .as_str()
            .unwrap()
            .contains("restart the service"),
        "{health}"
    );
}

/// A second instance in another PID namespace (as in a container) sharing the workspace
/// base directory: it cannot see the first one's pid, and must not take its directory.
#[tokio::test]
async fn a_second_instance_in_another_pid_namespace_leaves_the_first_alone() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: unshare --pid needs root");
        return;
    }
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let on_shared = || {
        Options::default()
            .default_workspace_dir()
            .env("SNAKECAGE_WORKSPACE__DIR", shared.path().display())
    };
    let a = Server::start_with(on_shared()).await;
    let a_root = shared.path().join(format!("workspaces-{}", a.pid()));
    assert!(a_root.is_dir());
    let b = tokio::spawn(Server::start_with(on_shared().wrapper(&[
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child=SIGTERM",
    ])))
    .await;
    // Whether or not it started, it must not have touched A's directory.
    assert!(
        a_root.is_dir(),
        "the second instance removed the first's workspaces"
    );
    let b = b.expect("the second instance (PID 1 of its namespace) did not start");
    for _ in 0..5 {
        let r = a.run("print('a')").await;
        assert_eq!(r["verdict"], "ok", "{r}");
        let r = b.run("print('b')").await;
        assert_eq!(r["verdict"], "ok", "{r}");
    }
    assert!(a.health().await["status"] == "ok");

    // A third one on A's state directory refuses to start, saying why.
    let third = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(crate::harness::repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", a.state_dir())
        .env("SNAKECAGE_WORKSPACE__DIR", shared.path())
        .env("SNAKECAGE_POOL__SIZE", "1")
        .output()
        .unwrap();
    assert!(!third.status.success());
    let said = String::from_utf8_lossy(&third.stderr);
    assert!(
        said.contains("in use by another running snakecage"),
        "{said}"
    );
    assert!(a_root.is_dir());
    assert_eq!(a.run("print(3)").await["stdout"], "3\n");
    drop(b);
    assert_eq!(a.run("print(4)").await["stdout"], "4\n");
}

/// A finished job's workspace goes, whatever the job left in it: nothing (removed on the
/// spot), files in nested non-ASCII directories, an empty directory, a file made and
/// deleted again. And whatever it left is reported: an empty workspace is not mistaken for
/// one with files, nor the other way round.
#[tokio::test]
async fn every_finished_jobs_workspace_is_removed_and_what_it_left_is_reported() {
    let s = Server::start().await;
    let root = workspaces_dir(&s);
    let jobs = [
        ("print(1)", vec![]),
        (
            "import os\nos.makedirs('données/日本')\nopen('données/日本/é.txt', 'w').write('✓')",
            vec!["données", "données/日本", "données/日本/é.txt"],
        ),
        ("import os\nos.mkdir('vide')", vec!["vide"]),
        (
            "import os\nopen('tmp.txt', 'w').write('x')\nos.remove('tmp.txt')",
            vec![],
        ),
    ];
    for round in 0..5 {
        for (code, want) in &jobs {
            let r = s.run(code).await;
            assert_eq!(r["verdict"], "ok", "round {round}: {r}");
            let mut paths: Vec<&str> = r["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["path"].as_str().unwrap())
                .collect();
            paths.sort_unstable();
            assert_eq!(&paths, want, "round {round}, {code:?}: {r}");
        }
    }
    // Only the workspaces of workers not yet used remain, and those are empty.
    eventually(10, "only unused, empty workspaces left", async || {
        let health = s.health().await;
        let pool = &health["pool"];
        let unused = pool["idle"].as_u64().unwrap() + pool["spawning"].as_u64().unwrap();
        // Only the workspaces are in it (the instance's lock file is beside it).
        let left: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .collect();
        let all_empty = left
            .iter()
            .all(|ws| std::fs::read_dir(ws.path()).unwrap().next().is_none());
        all_empty && left.len() as u64 <= unused
    })
    .await;
}
