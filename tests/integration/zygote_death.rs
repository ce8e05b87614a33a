//! A zygote that dies while one of its workers runs a stateless job takes the worker with
//! it (`PR_SET_PDEATHSIG`). Whether the job runs again depends on what got out of the
//! worker: nothing (no output, no tool call) and it runs again on a fresh worker, as if the
//! lost one had never been taken; anything, and the run ends `killed` with what it wrote.
//! The same path serves an idle worker taken just after its zygote died, before the
//! supervisor read of the death: the kernel is already killing it, but its job socket
//! still takes the job.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::harness::Server;
use crate::reliability::{eventually, workspace_root};
use crate::tools::server_with_tools;

/// What every job below writes in its workspace once it runs: the moment to kill.
pub const MARKER: &str = "commencé-ß.txt";

/// Runs `code`, which creates [`MARKER`] in its workspace once it has started, SIGKILLs
/// every zygote once the marker appears, and returns the run's answer once every tier has
/// a new zygote.
pub async fn run_while_the_zygotes_die(s: &Server, code: &str) -> Value {
    let zygotes: Vec<i32> = s.health().await["pool"]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["zygote"]["pid"].as_i64().unwrap() as i32)
        .collect();
    let run = s.spawn_execute(json!({ "code": code, "timeout_ms": 60_000 }));
    job_started(s).await;
    for pid in &zygotes {
        kill(Pid::from_raw(*pid), Signal::SIGKILL).unwrap();
    }
    let answer = run.await.unwrap();
    // Every tier came back with a new zygote.
    eventually(60, "every zygote restarted", async || {
        let health = s.health().await;
        health["pool"]["tiers"].as_array().unwrap().iter().all(|t| {
            t["zygote"]["alive"] == true
                && !zygotes.contains(&(t["zygote"]["pid"].as_i64().unwrap() as i32))
        })
    })
    .await;
    answer
}

/// Waits until a job has created [`MARKER`] in its workspace.
pub async fn job_started(s: &Server) {
    let root = workspace_root(s);
    eventually(60, "the job started", async || {
        std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .any(|ws| ws.path().join(MARKER).exists())
    })
    .await;
}

#[tokio::test]
async fn a_job_whose_zygote_dies_before_anything_came_out_runs_again_on_a_fresh_worker() {
    let s = Server::start().await;
    s.wait_for_every_tier().await;
    let code = format!(
        "import os, time\nopen({MARKER:?}, 'w').close()\ntime.sleep(2)\nprint('fini ✓', sorted(os.listdir('.')))"
    );
    let r = run_while_the_zygotes_die(&s, &code).await;
    assert_eq!(r["verdict"], "ok", "{r}\n{}", s.log());
    // Run again from the start, in a fresh workspace: only its own marker is there.
    assert_eq!(r["stdout"], format!("fini ✓ ['{MARKER}']\n"), "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    // The run after it is served as usual.
    assert_eq!(s.run("print('ensuite')").await["stdout"], "ensuite\n");
}

#[tokio::test]
async fn a_job_that_printed_before_its_zygote_died_ends_killed_with_its_output() {
    let s = Server::start().await;
    s.wait_for_every_tier().await;
    let code = format!(
        "import time\nprint('début ✓', flush=True)\nopen({MARKER:?}, 'w').close()\ntime.sleep(30)\nprint('fin')"
    );
    let r = run_while_the_zygotes_die(&s, &code).await;
    // Its output reached the service: running it again would show it twice.
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["stdout"], "début ✓\n", "{r}");
}

#[tokio::test]
async fn a_job_that_called_a_tool_before_its_zygote_died_is_not_run_again() {
    let (s, _dir) = server_with_tools("").await;
    s.wait_for_every_tier().await;
    // A tool call reaches the host: running the job again would call it twice.
    let code = format!(
        "import time\nfrom snakecage import tools\nt = tools.get_weather(city='Zürich')['temp']\nopen({MARKER:?}, 'w').close()\ntime.sleep(30)\nprint(t)"
    );
    let r = run_while_the_zygotes_die(&s, &code).await;
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["stdout"], "", "{r}");
}
