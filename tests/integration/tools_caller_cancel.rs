//! Calls of tools the caller declared that are cancelled before their answer comes: the
//! stream tells the client at once, with one `tool_call_cancelled` event
//! (`{"run_id", "call_id", "name", "reason", "message"}`) after the call's `tool_call`
//! and before the run's `result`, and an answer posted afterwards is a 410
//! `tool_call_cancelled` that says why, while the run lives and after it ended. Cancelled
//! by the program (an asyncio task), the run's deadline, `DELETE /v1/runs/{run_id}`, the
//! worker's death, its CPU time running out; stateless and session runs alike where
//! their paths differ.

use serde_json::{Value, json};

use crate::harness::Server;
use crate::streamed::StreamedRun;
use crate::tools::server_with_tools_env;
use crate::tools_caller::declared;

/// A server with the caller tools' test catalog whose calls never time out on their own
/// (`tools.call_timeout_ms` is a minute): only what a test does cancels them.
async fn server() -> (Server, tempfile::TempDir) {
    server_with_tools_env("", &[("SNAKECAGE_TOOLS__CALL_TIMEOUT_MS", "60000")]).await
}

/// The `tool_call_cancelled` events the run sent, in order.
fn cancels(run: &StreamedRun) -> Vec<Value> {
    run.seen
        .iter()
        .filter(|(event, _)| event == "tool_call_cancelled")
        .map(|(_, data)| data.clone())
        .collect()
}

/// Asserts that `run` sent exactly one `tool_call_cancelled` event, for `call` (its
/// `tool_call` event, which came before it), with `reason`.
fn assert_cancelled_once(run: &StreamedRun, call: &Value, reason: &str) {
    let cancels = cancels(run);
    assert_eq!(cancels.len(), 1, "{:?}", run.seen);
    let cancel = &cancels[0];
    assert_eq!(cancel["run_id"], run.run_id.as_str(), "{cancel}");
    assert_eq!(cancel["call_id"], call["call_id"], "{cancel}");
    assert_eq!(cancel["name"], call["name"], "{cancel}");
    assert_eq!(cancel["reason"], reason, "{cancel}");
    assert!(
        cancel["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{cancel}"
    );
    let at = |event: &str, data: &Value| {
        run.seen
            .iter()
            .position(|(e, d)| e == event && d == data)
            .unwrap()
    };
    assert!(at("tool_call", call) < at("tool_call_cancelled", cancel));
}

/// Posts an answer to `call` (a `tool_call` event of `run`), which must be refused as
/// cancelled for `reason`, the detail saying `why`.
async fn assert_late_answer_refused(run: &StreamedRun<'_>, call: &Value, reason: &str, why: &str) {
    let (status, body) = run.answer(call, &json!({"result": {"amount": 1}})).await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(body["code"], "tool_call_cancelled", "{body}");
    assert_eq!(
        body["detail"],
        format!(
            "tool call '{}' of run '{}' was cancelled ({reason}): {why}; it takes no answer",
            call["call_id"].as_str().unwrap(),
            run.run_id
        ),
        "{body}"
    );
}

/// A task awaiting `tools.aio` that the program cancels: the client is told
/// (`program_cancelled`) while the run goes on, an answer to the call is refused (during
/// the run and after it), and the run's next call is answered as usual.
#[tokio::test]
async fn a_call_whose_asyncio_task_is_cancelled_is_announced_and_a_late_answer_is_410() {
    let (s, _dir) = server().await;
    // Call 2 is answered once the client has seen call 1: call 1 is then the client's,
    // and the program cancels it.
    let code = "import asyncio
from snakecage import tools
first = asyncio.create_task(tools.aio.lookup_order(id=1))
print(await tools.aio.lookup_order(id=2))
first.cancel()
try:
    await first
except asyncio.CancelledError:
    print('cancelled')
print(await tools.aio.lookup_order(id=3))";
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "tools": declared(), "timeout_ms": 60000}),
        )
        .await;
    let (mut first, mut second) = (None::<Value>, None::<Value>);
    let why = "the program stopped waiting for it (its asyncio task was cancelled or timed out)";
    let result = run
        .answer_calls(async |run, call| {
            match call["arguments"]["id"].as_i64().unwrap() {
                1 => first = Some(call.clone()),
                2 => second = Some(call.clone()),
                _ => {
                    // Call 3 follows the cancel of call 1 on the worker's socket: the
                    // cancel has been taken, and the run still lives.
                    let first = first.as_ref().unwrap();
                    assert_late_answer_refused(run, first, "program_cancelled", why).await;
                    let (status, body) = run.answer(call, &json!({"result": 30})).await;
                    assert_eq!(status, 204, "{body}");
                }
            }
            if first.is_some()
                && let Some(call) = second.take()
            {
                let (status, body) = run.answer(&call, &json!({"result": 20})).await;
                assert_eq!(status, 204, "{body}");
            }
        })
        .await;
    assert_eq!(result["stdout"], "20\ncancelled\n30\n", "{result}");
    let first = first.unwrap();
    assert_cancelled_once(&run, &first, "program_cancelled");
    // After the run's end too.
    assert_late_answer_refused(&run, &first, "program_cancelled", why).await;
}

/// A call pending at the run's deadline: a stateless run's worker is killed, a session's
/// job interrupted; either way the client is told (`run_timeout`) before the result, and a
/// late answer is refused saying so.
#[tokio::test]
async fn a_call_pending_at_the_runs_deadline_is_announced_and_a_late_answer_is_410() {
    let (s, _dir) = server().await;
    let sid = s.new_session().await;
    for path in [
        "/v1/execute/stream".to_owned(),
        format!("/v1/sessions/{sid}/execute/stream"),
    ] {
        let code = "from snakecage import tools\ntools.never_answered()";
        let body = json!({"code": code, "tools": declared(), "timeout_ms": 1000});
        let mut run = s.stream(&path, &body).await;
        let call = run.until("tool_call").await;
        let result = run.result().await;
        assert_eq!(result["timed_out"], true, "{path}: {result}");
        assert_cancelled_once(&run, &call, "run_timeout");
        let why = "the run reached its time limit (timeout_ms)";
        assert_late_answer_refused(&run, &call, "run_timeout", why).await;
    }
}

/// A call outstanding when its run is cancelled with `DELETE /v1/runs/{run_id}`: the
/// client is told (`run_cancelled`), a stateless run and a session's alike.
#[tokio::test]
async fn a_call_pending_when_its_run_is_deleted_is_announced_and_a_late_answer_is_410() {
    let (s, _dir) = server().await;
    let sid = s.new_session().await;
    for (path, verdict) in [
        ("/v1/execute/stream".to_owned(), "killed"),
        (format!("/v1/sessions/{sid}/execute/stream"), "error"),
    ] {
        let code = "from snakecage import tools\ntools.never_answered()";
        let body = json!({"code": code, "tools": declared(), "timeout_ms": 60000});
        let mut run = s.stream(&path, &body).await;
        let call = run.until("tool_call").await;
        assert_eq!(run.cancel().await, 204);
        let cancel = run.until("tool_call_cancelled").await;
        assert_eq!(cancel["reason"], "run_cancelled", "{cancel}");
        let result = run.result().await;
        assert_eq!(result["verdict"], verdict, "{path}: {result}");
        assert_cancelled_once(&run, &call, "run_cancelled");
        let why = "the run was cancelled (DELETE /v1/runs/{run_id})";
        assert_late_answer_refused(&run, &call, "run_cancelled", why).await;
    }
}

/// A call outstanding when the worker dies (here it exits without reporting, as a crash
/// would end it): the client is told (`worker_lost`).
#[tokio::test]
async fn a_call_pending_when_the_worker_dies_is_announced_and_a_late_answer_is_410() {
    let (s, _dir) = server().await;
    // The worker exits once the client has answered call 1, which it does once it has
    // seen the call that stays pending.
    let code = "from snakecage import tools
import os, threading
threading.Thread(target=tools.never_answered, daemon=True).start()
tools.lookup_order(id=1)
os._exit(3)";
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "tools": declared(), "timeout_ms": 60000}),
        )
        .await;
    let (mut pending, mut held) = (None::<Value>, None::<Value>);
    let result = run
        .answer_calls(async |run, call| {
            match call["name"].as_str().unwrap() {
                "never_answered" => pending = Some(call.clone()),
                _ => held = Some(call.clone()),
            }
            if pending.is_some()
                && let Some(call) = held.take()
            {
                let (status, body) = run.answer(&call, &json!({"result": 1})).await;
                assert_eq!(status, 204, "{body}");
            }
        })
        .await;
    assert_eq!(result["verdict"], "killed", "{result}");
    let pending = pending.unwrap();
    assert_cancelled_once(&run, &pending, "worker_lost");
    assert_late_answer_refused(&run, &pending, "worker_lost", "the run's worker died").await;
}

/// A call pending when the worker is killed for its CPU time: the client is told that
/// (`cpu_time_limit`), not that the worker was lost for no reason; a stateless run and a
/// session's alike. The kill is the kernel's SIGXCPU at the worker's `RLIMIT_CPU`, the
/// signal of the service's budget where the kernel enforces it, brought forward by the
/// program: past the Python layer (switched off here) it may lower its own soft limit, to
/// the next second of CPU time, and it spins. The service's budget itself would need more
/// than a core for longer than the run's deadline, which a busy host does not give (the
/// `session_cpu` tests show that budget); a second of CPU time ends this run however busy
/// the host, long before its deadline of a minute. It spins only once the client has seen
/// the call that stays pending, which is made first, on a thread of its own.
#[tokio::test]
async fn a_call_pending_when_the_cpu_time_runs_out_is_announced_and_a_late_answer_is_410() {
    let (s, _dir) = server_with_tools_env(
        "",
        &[
            ("SNAKECAGE_TOOLS__CALL_TIMEOUT_MS", "60000"),
            ("SNAKECAGE_SANDBOX__REQUIRE", crate::escapes::OS_LAYERS),
            (
                "SNAKECAGE_SANDBOX__LAYERS_OFF",
                r#"["audit_hook", "import_guard"]"#,
            ),
        ],
    )
    .await;
    let code = "from snakecage import tools
import resource, threading, time
threading.Thread(target=tools.never_answered, daemon=True).start()
tools.lookup_order(id=1)
hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
resource.setrlimit(resource.RLIMIT_CPU, (int(time.process_time()) + 1, hard))
while True:
    pass";
    let sid = s.new_session().await;
    for (path, session) in [
        ("/v1/execute/stream".to_owned(), false),
        (format!("/v1/sessions/{sid}/execute/stream"), true),
    ] {
        let body = json!({"code": code, "tools": declared(), "timeout_ms": 60000});
        let mut run = s.stream(&path, &body).await;
        let (mut pending, mut held) = (None::<Value>, None::<Value>);
        let result = run
            .answer_calls(async |run, call| {
                match call["name"].as_str().unwrap() {
                    "never_answered" => pending = Some(call.clone()),
                    _ => held = Some(call.clone()),
                }
                if pending.is_some()
                    && let Some(call) = held.take()
                {
                    let (status, body) = run.answer(&call, &json!({"result": 1})).await;
                    assert_eq!(status, 204, "{body}");
                }
            })
            .await;
        if session {
            // The session is gone, and says it was for its CPU time.
            assert_eq!(result["verdict"], "killed", "{result}");
            let notice = result["notice"].as_str().unwrap_or_default();
            assert!(
                notice.contains("its worker used up its CPU time")
                    && notice.contains("killed by signal 24 (SIGXCPU)"),
                "{result}"
            );
        } else {
            // The CPU-time backstop: a timeout by another clock.
            assert_eq!(result["timed_out"], true, "{result}");
        }
        let pending = pending.unwrap();
        assert_cancelled_once(&run, &pending, "cpu_time_limit");
        let why = "the run's worker used up its CPU time (the backstop behind the time \
                   limit) and was killed";
        assert_late_answer_refused(&run, &pending, "cpu_time_limit", why).await;
    }
}
