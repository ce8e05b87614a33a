//! The supervisor stages and collects files as root in a workspace the job may be changing
//! at that moment: a session's threads go on between its runs. A thread that keeps
//! swapping a directory for a link to a host directory must get neither a host file into
//! its stored files (collection) nor a staged file written outside (staging).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::files::upload;
use crate::harness::{Options, Server, process_exists};
use crate::reliability::eventually;

/// A thread of the session that swaps `d0`…`d7` between a directory holding `secret.txt`
/// and a link to `host`, for as long as the worker lives.
fn swapper(host: &str) -> String {
    format!(
        r#"
import os, shutil, threading
def swap(d):
    while True:
        try:
            if os.path.islink(d):
                os.unlink(d)
                os.mkdir(d)
                with open(os.path.join(d, "secret.txt"), "w") as f:
                    f.write("mine")
            else:
                shutil.rmtree(d, ignore_errors=True)
                os.symlink({host:?}, d)
        except OSError:
            pass
for i in range(8):
    threading.Thread(target=swap, args=(f"d{{i}}",), daemon=True).start()
print("swapping")
"#
    )
}

#[tokio::test]
async fn a_thread_swapping_directories_for_links_reaches_no_host_file() {
    // Readable by root alone: only a supervisor that follows the link could read it.
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("secret.txt"), "host secret ñ\n").unwrap();
    std::fs::set_permissions(
        host.path().join("secret.txt"),
        PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let host_dir = host.path().display().to_string();
    let s = Server::start().await;
    let (status, session) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap().to_owned();
    let run = |body: Value| {
        let path = format!("/v1/sessions/{id}/execute");
        let s = &s;
        async move { s.post(&path, &body).await }
    };
    let (status, started) = run(json!({"code": swapper(&host_dir)})).await;
    assert_eq!(status, 200, "{started}");
    assert_eq!(started["stdout"], "swapping\n", "{started}");
    let staged = upload(&s, "eingabe.csv", b"a,b\n".to_vec()).await;
    let file_id = staged["file_id"].as_str().unwrap();

    let (mut collected, mut links_seen, mut staged_ok, mut refused) = (0, 0, 0, 0);
    for i in 0..40 {
        // Collection (every run): whatever the scan saw, a file is read only through
        // directories that are directories. Staging (every other run): into a directory
        // the thread is swapping.
        let mut body = json!({"code": "import time; time.sleep(0.02)"});
        if i % 2 == 1 {
            body["files"] =
                json!([{"path": format!("d{}/eingabe-{i}.csv", i % 8), "file_id": file_id}]);
        }
        let (status, body) = run(body).await;
        match status {
            200 if i % 2 == 1 => staged_ok += 1,
            200 => {}
            422 => {
                let detail = body["detail"].as_str().unwrap();
                assert!(detail.contains("cannot stage file at 'd"), "{body}");
                refused += 1;
                continue;
            }
            other => panic!("{other}: {body}"),
        }
        for file in body["files"].as_array().unwrap() {
            let Some(file_id) = file["file_id"].as_str() else {
                continue;
            };
            let (status, _, text) = s.get(&format!("/v1/files/{file_id}")).await;
            assert_eq!(status, 200);
            assert!(
                !text.contains("host secret"),
                "a host file was collected: {file}"
            );
            collected += 1;
        }
        links_seen += body["skipped_files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["reason"].as_str().unwrap().contains("symbolic link"))
            .count();
    }
    // The race was on: the scans met links and collected the thread's own files.
    assert!(
        links_seen > 0 && collected > 0,
        "links {links_seen}, collected {collected}"
    );
    assert_eq!(staged_ok + refused, 20);
    let names: Vec<_> = std::fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["secret.txt"], "a staged file was written outside");
    assert_eq!(
        std::fs::read_to_string(host.path().join("secret.txt")).unwrap(),
        "host secret ñ\n"
    );
}

/// Staging into a session never removes or writes anything by name: a link the program put
/// on a staged path's way is a 422, and the host file behind it is still there; a refused
/// request leaves the workspace as it was.
#[tokio::test]
async fn staging_through_a_link_neither_deletes_nor_writes_the_host_file() {
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("s.txt"), "host secret ñ\n").unwrap();
    std::fs::set_permissions(host.path().join("s.txt"), PermissionsExt::from_mode(0o600)).unwrap();
    let s = Server::start().await;
    let (_, session) = s.post("/v1/sessions", &json!({})).await;
    let id = session["session_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/sessions/{id}/execute");
    let code = format!(
        "import os\nos.symlink({:?}, 'd')\nopen('keep.txt', 'w').write('mine')\nos.mkdir('dir')",
        host.path().display().to_string()
    );
    let (status, body) = s.post(&path, &json!({ "code": code })).await;
    assert_eq!(status, 200, "{body}");
    let file_id = upload(&s, "ersatz.txt", b"staged".to_vec()).await["file_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for files in [
        json!([{"path": "d/s.txt", "file_id": file_id}]),
        json!([{"path": "keep.txt", "file_id": file_id}, {"path": "dir", "file_id": file_id}]),
    ] {
        let (status, body) = s.post(&path, &json!({"code": "1", "files": files})).await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body["detail"].as_str().unwrap().contains("is in the way"),
            "{body}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(host.path().join("s.txt")).unwrap(),
        "host secret ñ\n"
    );
    let (_, body) = s
        .post(
            &path,
            &json!({"code": "print(open('keep.txt').read(), sorted(os.listdir('.')))"}),
        )
        .await;
    assert_eq!(body["stdout"], "mine ['d', 'dir', 'keep.txt']\n", "{body}");
}

/// A session nests directories 25,000 deep: too deep for its workspace to be measured
/// against the session's bound, it is ended, and its workspace is removed without
/// overflowing the supervisor's stack, which goes on serving.
///
/// The nest grows from the top (a new directory, the nest moved into it, renamed back), so
/// no call of the job goes more than two levels down: Landlock checks every access along
/// the whole path, and 25,000 `mkdir`s each one level below the last take time quadratic
/// in the depth (half a minute of a quiet machine's CPU, past any deadline on a busy one).
/// The workspace is where the service puts it by default (a tmpfs), not on the disk.
#[tokio::test]
async fn a_workspace_nested_deeper_than_any_stack_is_removed_and_the_service_lives() {
    let s = Server::start_with(Options::default().default_workspace_dir()).await;
    let (_, session) = s.post("/v1/sessions", &json!({})).await;
    let id = session["session_id"].as_str().unwrap().to_owned();
    let code = "import os
os.mkdir('tief')
for i in range(25000 - 1):
    os.mkdir('neu')
    os.rename('tief', 'neu/tief')
    os.rename('neu', 'tief')
print(os.getcwd())";
    let (status, body) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": code, "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["verdict"], "ok", "{body}");
    assert!(
        body["notice"]
            .as_str()
            .unwrap_or_default()
            .contains("could not be measured whole"),
        "{body}"
    );
    let workspace = PathBuf::from(body["stdout"].as_str().unwrap().trim_end());
    // The removal runs off the request; once it is done, the service is still there, and
    // so is its pool.
    eventually(300, "the session's workspace is removed", async || {
        assert!(
            process_exists(s.pid()),
            "the service died removing the workspace:\n{}",
            s.log()
        );
        !workspace.exists()
    })
    .await;
    assert_eq!(s.health().await["status"], "ok");
    assert_eq!(s.run("print('weiter')").await["stdout"], "weiter\n");
}
