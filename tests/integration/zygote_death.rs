//! A zygote that dies while one of its workers runs a stateless job takes the worker with
//! it (`PR_SET_PDEATHSIG`). Whether the job runs again depends on what got out of the
//! worker: nothing (no output, no tool call) and it runs again on a fresh worker, as if the
//! lost one had never been taken; anything, and the run ends `killed` with what it wrote.
//! The same path serves an idle worker taken just after its zygote died, before the
//! supervisor read of the death: the kernel is already killing it, but its job socket
//! still takes the job. The death is read when the zygote's process exits, even while
//! another process (a child it forked just before) still holds its control socket open.

use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::harness::Server;
use crate::reliability::{eventually, workspaces_dir};
use crate::tools::server_with_tools;

/// What every job below writes in its workspace once it runs: the moment to kill.
pub const MARKER: &str = "commencé-ß.txt";

/// Runs `code`, which creates [`MARKER`] in its workspace once it has started, SIGKILLs
/// the zygote of the worker running it once the marker appears, and returns the run's
/// answer once that tier has a new zygote. With `hold_its_socket`, a copy of the zygote's
/// end of its control socket is held open meanwhile.
pub async fn run_while_its_zygote_dies(s: &Server, code: &str, hold_its_socket: bool) -> Value {
    run_with_timeout_while_its_zygote_dies(s, code, 60_000, hold_its_socket).await
}

/// [`run_while_its_zygote_dies`] with the run's `timeout_ms`.
async fn run_with_timeout_while_its_zygote_dies(
    s: &Server,
    code: &str,
    timeout_ms: u64,
    hold_its_socket: bool,
) -> Value {
    let run = s.spawn_execute(json!({ "code": code, "timeout_ms": timeout_ms }));
    let workspace = job_started(s).await;
    let zygote = parent_of(process_in(&workspace));
    let _held = hold_its_socket.then(|| steal_fd(zygote, 3));
    kill(Pid::from_raw(zygote), Signal::SIGKILL).unwrap();
    let answer = run.await.unwrap();
    eventually(60, "the zygote restarted", async || {
        let health = s.health().await;
        health["pool"]["tiers"].as_array().unwrap().iter().all(|t| {
            t["zygote"]["alive"] == true && t["zygote"]["pid"].as_i64() != Some(zygote.into())
        })
    })
    .await;
    answer
}

/// Waits until a job has created [`MARKER`] in its workspace; returns the workspace.
pub async fn job_started(s: &Server) -> PathBuf {
    let root = workspaces_dir(s);
    let found = || {
        std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|ws| ws.path())
            .find(|ws| ws.join(MARKER).exists())
    };
    eventually(60, "the job started", async || found().is_some()).await;
    found().unwrap()
}

/// The process whose working directory is `dir` (the worker of a workspace).
fn process_in(dir: &Path) -> i32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .unwrap_or_else(|| panic!("no process works in {}", dir.display()))
}

fn parent_of(pid: i32) -> i32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_job_whose_zygote_dies_before_anything_came_out_runs_again_on_a_fresh_worker() {
    let s = Server::start().await;
    s.wait_for_every_tier().await;
    let code = format!(
        "import os, time\nopen({MARKER:?}, 'w').close()\ntime.sleep(2)\nprint('fini ✓', sorted(os.listdir('.')))"
    );
    let r = run_while_its_zygote_dies(&s, &code, false).await;
    assert_eq!(r["verdict"], "ok", "{r}\n{}", s.log());
    // Run again from the start, in a fresh workspace: only its own marker is there.
    assert_eq!(r["stdout"], format!("fini ✓ ['{MARKER}']\n"), "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    // The run after it is served as usual.
    assert_eq!(s.run("print('ensuite')").await["stdout"], "ensuite\n");
}

#[tokio::test]
async fn a_job_run_again_has_only_what_is_left_of_its_timeout() {
    let s = Server::start().await;
    s.wait_for_every_tier().await;
    // 3 s before the marker, 1.5 s after: 4.5 s fits in the 6 s timeout once. The first
    // worker is lost after ~3 s, so the run on the second one has ~3 s left, not 6.
    let code = format!(
        "import time\ntime.sleep(3)\nopen({MARKER:?}, 'w').close()\ntime.sleep(1.5)\nprint('fini ✓')"
    );
    let r = run_with_timeout_while_its_zygote_dies(&s, &code, 6_000, false).await;
    assert_eq!(r["verdict"], "timeout", "{r}\n{}", s.log());
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["stdout"], "", "{r}");
    // Given its whole timeout, the same job runs to the end.
    let whole = s
        .run_with(json!({ "code": code.replace(MARKER, "autre.txt"), "timeout_ms": 6_000 }))
        .await;
    assert_eq!(whole["verdict"], "ok", "{whole}");
    assert_eq!(whole["stdout"], "fini ✓\n", "{whole}");
}

#[tokio::test]
async fn a_job_that_printed_before_its_zygote_died_ends_killed_with_its_output() {
    let s = Server::start().await;
    s.wait_for_every_tier().await;
    let code = format!(
        "import time\nprint('début ✓', flush=True)\nopen({MARKER:?}, 'w').close()\ntime.sleep(30)\nprint('fin')"
    );
    let r = run_while_its_zygote_dies(&s, &code, false).await;
    // Its output reached the service: running it again would show it twice.
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["stdout"], "début ✓\n", "{r}");
    // And it says what killed it.
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.ends_with(
            "The worker was killed because its zygote, the process it was forked from, died: \
             by design a worker dies with its zygote (PR_SET_PDEATHSIG), so that no sandboxed \
             process outlives the one that reaps it. The service restarts the zygote."
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_job_that_called_a_tool_before_its_zygote_died_is_not_run_again() {
    let (s, _dir) = server_with_tools("").await;
    s.wait_for_every_tier().await;
    // A tool call reaches the host: running the job again would call it twice.
    let code = format!(
        "import time\nfrom snakecage import tools\nt = tools.get_weather(city='Zürich')['temp']\nopen({MARKER:?}, 'w').close()\ntime.sleep(30)\nprint(t)"
    );
    let r = run_while_its_zygote_dies(&s, &code, false).await;
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["stdout"], "", "{r}");
}

/// A copy of fd `fd` of process `pid` (`pidfd_getfd`; needs the right to ptrace it: root).
fn steal_fd(pid: i32, fd: i32) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open and pidfd_getfd take plain integers and return new fds or -1;
    // each fd returned is owned by nothing else.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let pidfd = std::os::fd::OwnedFd::from_raw_fd(pidfd as i32);
        let got = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        );
        assert!(got >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        std::os::fd::OwnedFd::from_raw_fd(got as i32)
    }
}

#[tokio::test]
async fn a_zygote_is_known_dead_once_it_exits_though_its_socket_is_still_held_open() {
    let s = Server::start().await;
    s.wait_for_every_tier().await;
    let code =
        format!("import time\nopen({MARKER:?}, 'w').close()\ntime.sleep(1)\nprint('encore ✓')");
    // A child the zygote forked just before it died holds its end of the control socket
    // (fd 3) until it has closed what it inherited; so does a copy held by the test. The
    // death is seen all the same (the zygote is restarted), and the job that died with it
    // runs again.
    let r = run_while_its_zygote_dies(&s, &code, true).await;
    assert_eq!(r["verdict"], "ok", "{r}\n{}", s.log());
    assert_eq!(r["stdout"], "encore ✓\n", "{r}");
}
