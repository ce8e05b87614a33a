//! Runs still going when the shutdown grace period runs out are killed with their
//! workers, and say so: stateless, in a session, streamed. The session ends with the
//! service, and once the service is back a call on it is 410 `session_gone` saying the
//! service restarted (its id names the start of the process it lived in), not 404.

use std::time::Instant;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::harness::{Options, Server};
use crate::reliability::{eventually, workspaces_dir};

/// What every run below writes in its workspace once it has printed: the moment to stop.
const MARKER: &str = "started.txt";

const WHY: &str = "The service shut down before this run ended";

fn long_run() -> Value {
    let code = format!(
        "import time\nprint('started', flush=True)\nopen({MARKER:?}, 'w').close()\ntime.sleep(300)"
    );
    json!({ "code": code, "timeout_ms": 600_000 })
}

/// How many workspaces hold [`MARKER`].
fn started(s: &Server) -> usize {
    std::fs::read_dir(workspaces_dir(s))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|ws| ws.path().join(MARKER).exists())
        .count()
}

#[tokio::test]
async fn runs_killed_past_the_shutdown_grace_say_so_and_their_session_is_gone_after_a_restart() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 4)
            .env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", 600_000)
            .env("SNAKECAGE_WORKER__SHUTDOWN_DRAIN_MS", 0)
            .env("SNAKECAGE_WORKER__SHUTDOWN_GRACE_MS", 1000),
    )
    .await;
    let id = s.new_session().await;
    s.session_run(&id, "x = 1").await;

    let stateless = s.spawn_execute(long_run());
    let in_session = {
        let request = s
            .client
            .post(format!("{}/v1/sessions/{id}/execute", s.base))
            .json(&long_run());
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.unwrap()
        })
    };
    let streamed = {
        let response = s.post_response("/v1/execute/stream", &long_run()).await;
        assert_eq!(response.status(), 200);
        tokio::spawn(crate::stream::read_events(response, Instant::now(), |_| {
            false
        }))
    };
    eventually(60, "all three runs started", async || started(&s) == 3).await;

    kill(Pid::from_raw(s.pid() as i32), Signal::SIGTERM).unwrap();
    let stateless = stateless.await.unwrap();
    let in_session = in_session.await.unwrap();
    let events = streamed.await.unwrap();
    let streamed = &events
        .iter()
        .find(|e| e.event == "result")
        .unwrap_or_else(|| panic!("no result: {events:?}\n{}", s.log()))
        .data;
    for (what, r) in [
        ("stateless", &stateless),
        ("session", &in_session),
        ("stream", streamed),
    ] {
        assert_eq!(r["verdict"], "killed", "{what}: {r}");
        assert_eq!(r["stdout"], "started\n", "{what}: {r}");
        let stderr = r["stderr"].as_str().unwrap();
        assert!(stderr.contains(WHY), "{what}: {stderr}\n{}", s.log());
        assert!(!stderr.contains("without reporting"), "{what}: {stderr}");
    }
    let notice = in_session["notice"].as_str().unwrap();
    assert!(notice.contains("the service shut down"), "{notice}");
    assert!(notice.contains("once the service is back"), "{notice}");
    let status = s.stop();
    assert!(status.success(), "{status:?}");

    // Another start of the service: the session's id names the one it lived in.
    let again = Server::start().await;
    let (status, r) = again.get_json(&format!("/v1/sessions/{id}")).await;
    gone_with_the_restart(status, &r);
    let path = format!("/v1/sessions/{id}/execute");
    let (status, r) = again.post(&path, &json!({ "code": "print(x)" })).await;
    gone_with_the_restart(status, &r);
    // An id of this start that names no session is unknown, as ever.
    let mine = again.new_session().await;
    let (prefix, random) = mine.rsplit_once('_').unwrap();
    let unknown = format!("{prefix}_{}", "0".repeat(random.len()));
    let (status, r) = again.get_json(&format!("/v1/sessions/{unknown}")).await;
    assert_eq!(status, 404, "{unknown}: {r}");
    assert_eq!(r["code"], "session_not_found", "{r}");
}

fn gone_with_the_restart(status: u16, r: &Value) {
    assert_eq!(status, 410, "{r}");
    assert_eq!(r["code"], "session_gone", "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(detail.contains("the service restarted"), "{detail}");
}
