//! A run whose code ends its own process: `sys.exit(n)` is an exit code; `os._exit(n)`
//! ends the worker before it can report, and the answer says with which status.

use crate::harness::Server;

#[tokio::test]
async fn os_exit_ends_the_worker_and_the_answer_says_with_which_status() {
    let s = Server::start().await;

    let r = s.run("import sys\nsys.exit(7)").await;
    assert_eq!(
        (r["verdict"].as_str(), r["exit_code"].as_i64()),
        (Some("error"), Some(7)),
        "{r}"
    );

    let r = s
        .run("import os\nprint('bye', flush=True)\nos._exit(7)")
        .await;
    assert_eq!(r["verdict"], "killed", "{r}");
    assert!(r["exit_code"].is_null(), "{r}");
    assert_eq!(r["stdout"], "bye\n", "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("The worker exited with status 7 before reporting a result")
            && stderr.contains("sys.exit()"),
        "{r}"
    );

    // In a session the worker, and the session, are gone; the answer says how.
    let id = s.new_session().await;
    let r = s.session_run(&id, "import os\nos._exit(3)").await;
    assert_eq!(r["verdict"], "killed", "{r}");
    assert!(
        r["notice"]
            .as_str()
            .unwrap()
            .contains("exited with status 3"),
        "{r}"
    );
}
