//! Code Mode with tools the caller declares and answers over SSE (`tool_call` events,
//! `POST /v1/runs/{run_id}/tool_calls/{call_id}`): answers and errors, the per-call
//! timeout, answers to calls no longer waiting, a deadline while a call is pending,
//! `DELETE /v1/runs/{run_id}`.

use serde_json::{Value, json};

use crate::streamed::StreamedRun;
use crate::tools::server_with_tools;

pub(crate) fn declared() -> Value {
    json!([
        {"type": "function", "function": {"name": "lookup_order", "description": "An order by id",
          "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}},
        {"name": "never_answered", "description": "The client never answers", "input_schema": {"type": "object"}}
    ])
}

#[tokio::test]
async fn caller_tools_are_answered_over_sse() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
total = 0
for i in range(1, 4):
    total += tools.lookup_order(id=i)['amount']
print('total', total)
try:
    tools.lookup_order(id=99)
except tools.ToolError as e:
    print('error', e.message, e.data)\n";
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "tools": declared()}),
        )
        .await;
    let mut calls = 0;
    let result = run
        .answer_calls(async |run, call| {
            calls += 1;
            assert_eq!(call["run_id"], run.run_id.as_str());
            assert_eq!(call["name"], "lookup_order");
            let id = call["arguments"]["id"].as_i64().unwrap();
            let answer = if id == 99 {
                json!({"error": {"message": "no order 99", "data": {"id": 99}}})
            } else {
                json!({"result": {"amount": id * 10}})
            };
            let (status, body) = run.answer(call, &answer).await;
            assert_eq!(status, 204, "{body}");
            if calls == 1 {
                // A second answer to the same call is refused (the run still waits on
                // later calls, so it is still there).
                let (status, body) = run.answer(call, &answer).await;
                assert_eq!(status, 409, "{body}");
                assert_eq!(body["code"], "tool_call_not_waiting", "{body}");
            }
        })
        .await;
    let unexpected = run.events_other_than(&["output", "tool_call", "result"]);
    assert!(unexpected.is_empty(), "unexpected events: {unexpected:?}");
    assert_eq!(calls, 4);
    assert_eq!(
        result["stdout"], "total 60\nerror no order 99 {'id': 99}\n",
        "{result}"
    );
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(
            r#"snakecage_tool_calls_total{outcome="ok",provider="caller",tool="caller"} 3"#
        ),
        "{metrics}"
    );

    // On plain /v1/execute nobody could answer them.
    let (status, body) = s
        .post("/v1/execute", &json!({"code": "1", "tools": declared()}))
        .await;
    assert_eq!(status, 422);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("/v1/execute/stream"),
        "{body}"
    );
    let (status, body) = s
        .post(
            "/v1/execute/stream",
            &json!({"code": "1", "tools": [{"name": "bad name"}]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
}

#[tokio::test]
async fn an_unanswered_call_times_out_and_a_deadline_cancels_a_pending_call() {
    let (s, _dir) = server_with_tools("").await;
    // Per-call timeout: the program gets ToolTimeoutError and finishes.
    let code = "from snakecage import tools
try:
    tools.never_answered()
except tools.ToolTimeoutError as e:
    print('timeout')\n";
    let resp = s
        .client
        .post(format!("{}/v1/execute/stream", s.base))
        .json(&json!({"code": code, "tools": declared()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: tool_call"), "{text}");
    assert!(text.contains(r#""stdout":"timeout\n""#), "{text}");

    // The run's deadline (1 s) comes before the call's timeout (1.5 s): killed at once, the
    // pending call cancelled (an answer to it is refused, saying why), the run gone.
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": "from snakecage import tools\ntools.never_answered()", "tools": declared(), "timeout_ms": 1000}),
        )
        .await;
    let call = run.until("tool_call").await;
    let call_id = call["call_id"].as_str().unwrap();
    let result = run.result().await;
    assert_eq!(result["timed_out"], true, "{result}");
    assert!(!call_id.is_empty());
    let (status, body) = run.answer_id(call_id, &json!({"result": 1})).await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(body["code"], "tool_call_cancelled", "{body}");
    // Nothing is left waiting: no run holds a pending call.
    let (_, _, status) = s.get("/v1/status").await;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["tools"]["runs_waiting"], 0, "{status}");
}

/// An answer the run no longer waits for, while the run goes on: a second answer to a
/// call is a 409 of its own code (no session is involved); an answer to a call that timed
/// out, whose client was told with a `tool_call_cancelled` event, is a 410 that says so;
/// and the run's later calls are answered as usual.
#[tokio::test]
async fn answers_to_calls_that_are_not_waiting_get_their_own_code() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
try:
    tools.never_answered(city='Zürich')
except tools.ToolTimeoutError:
    print('timed out')
print(tools.lookup_order(id=7)['amount'])
print(tools.lookup_order(id=8)['amount'])\n";
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "tools": declared(), "timeout_ms": 20000}),
        )
        .await;
    let mut calls: Vec<String> = Vec::new();
    let not_waiting = |status: u16, body: &Value, run: &StreamedRun, call: &str| {
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["code"], "tool_call_not_waiting", "{body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!(
                "tool call '{call}' of run '{}' is not waiting for an answer",
                run.run_id
            )),
            "{detail}"
        );
    };
    let result = run
        .answer_calls(async |run, data| {
            let call = data["call_id"].as_str().unwrap().to_owned();
            calls.push(call.clone());
            match calls.len() {
                // never_answered: left to time out (1.5 s).
                1 => assert_eq!(data["name"], "never_answered", "{data}"),
                // The first call timed out before this one was made: answering it now
                // is refused, and this one is still answered.
                2 => {
                    let (status, body) = run.answer_id(&calls[0], &json!({"result": "spät"})).await;
                    assert_eq!(status, 410, "{body}");
                    assert_eq!(body["code"], "tool_call_cancelled", "{body}");
                    assert_eq!(
                        body["detail"],
                        format!(
                            "tool call '{}' of run '{}' was cancelled (call_timeout): it was \
                             not answered within tools.call_timeout_ms; it takes no answer",
                            calls[0], run.run_id
                        ),
                        "{body}"
                    );
                    let (status, body) = run
                        .answer_id(&call, &json!({"result": {"amount": 70}}))
                        .await;
                    assert_eq!(status, 204, "{body}");
                }
                // The second call was answered already; the run is now waiting on this one.
                3 => {
                    let (status, body) = run
                        .answer_id(&calls[1], &json!({"result": {"amount": 0}}))
                        .await;
                    not_waiting(status, &body, run, &calls[1]);
                    let (status, body) = run
                        .answer_id(&call, &json!({"result": {"amount": 80}}))
                        .await;
                    assert_eq!(status, 204, "{body}");
                }
                n => panic!("call {n}: {data}"),
            }
        })
        .await;
    assert_eq!(calls.len(), 3, "{result}");
    assert_eq!(result["stdout"], "timed out\n70\n80\n", "{result}");
    let cancels: Vec<&Value> = run
        .seen
        .iter()
        .filter(|(event, _)| event == "tool_call_cancelled")
        .map(|(_, data)| data)
        .collect();
    assert_eq!(cancels.len(), 1, "{:?}", run.seen);
    assert_eq!(cancels[0]["call_id"], calls[0].as_str(), "{}", cancels[0]);
    assert_eq!(cancels[0]["reason"], "call_timeout", "{}", cancels[0]);
    assert_eq!(result["exit_code"], 0, "{result}");
}

/// A tool may answer `null`; an `error` of `null` beside a result is no error, and alone it
/// is no answer; an `error` must hold a message.
#[tokio::test]
async fn a_caller_may_answer_null() {
    let (s, _dir) = server_with_tools("").await;
    let code = "from snakecage import tools
print(repr(tools.lookup_order(id=1)), repr(tools.lookup_order(id=2)))\n";
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "tools": declared()}),
        )
        .await;
    let result = run
        .answer_calls(async |run, call| {
            if call["arguments"]["id"] == 1 {
                let (status, body) = run.answer(call, &json!({"result": null})).await;
                assert_eq!(status, 204, "{body}");
            } else {
                for nothing in [json!({"error": null}), json!({})] {
                    let (status, body) = run.answer(call, &nothing).await;
                    assert_eq!(status, 422, "{body}");
                    assert!(
                        body["detail"].as_str().unwrap().contains("exactly one of"),
                        "{body}"
                    );
                }
                // An error that holds no message is refused, not made one; the call waits.
                for (error, what) in [
                    (json!(42), "`42`"),
                    (json!(["nö"]), "`[\"nö\"]`"),
                    (json!({"data": 1}), "an object without a `message` string"),
                    (
                        json!({"message": 7}),
                        "an object without a `message` string",
                    ),
                ] {
                    let (status, body) = run.answer(call, &json!({ "error": error })).await;
                    assert_eq!(status, 422, "{body}");
                    assert!(
                        body["detail"]
                            .as_str()
                            .unwrap()
                            .starts_with(&format!("`error` is {what}: give a message")),
                        "{body}"
                    );
                }
                let both = json!({"result": {"amount": "zwanzig €"}, "error": null});
                let (status, body) = run.answer(call, &both).await;
                assert_eq!(status, 204, "{body}");
            }
        })
        .await;
    assert_eq!(
        result["stdout"], "None {'amount': 'zwanzig €'}\n",
        "{result}"
    );
}

/// An answer is bounded by the result cap (`tools.max_result_bytes`, here 65536), not by
/// `limits.max_request_bytes` (here 4096): a 20 KB result is delivered; one the cap
/// refuses raises `ToolLimitError` in the program; one far past it is a 413 that names the
/// cap, and the call then times out.
#[tokio::test]
async fn answers_are_bounded_by_the_result_cap_not_the_request_limit() {
    let (s, _dir) =
        crate::tools::server_with_tools_env("", &[("SNAKECAGE_LIMITS__MAX_REQUEST_BYTES", "4096")])
            .await;
    let code = "from snakecage import tools
print(len(tools.lookup_order(id=1)['text']))
for i in (2, 3):
    try:
        tools.lookup_order(id=i)
    except tools.ToolError as e:
        print(type(e).__name__)\n";
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "tools": declared(), "timeout_ms": 10000}),
        )
        .await;
    let result = run
        .answer_calls(async |run, call| {
            let (chars, status) = match call["arguments"]["id"].as_i64().unwrap() {
                1 => (10_000, 204), // 20 KB of 'ü'
                2 => (50_000, 204), // 100 KB: past the cap
                _ => (200_000, 413),
            };
            let answer = json!({"result": {"text": "ü".repeat(chars)}});
            let (got, body) = run.answer(call, &answer).await;
            assert_eq!(got, status, "{body}");
            if status == 413 {
                assert!(
                    body["detail"]
                        .as_str()
                        .unwrap()
                        .contains("tools.max_result_bytes: 65536"),
                    "{body}"
                );
            }
        })
        .await;
    assert_eq!(
        result["stdout"], "10000\nToolLimitError\nToolTimeoutError\n",
        "{result}"
    );
}

/// In a session each run has its own tools, whichever thread asks: a thread the run
/// started sees its caller tools, and once the run has ended a thread it left waiting
/// finds only the next run's (here the operator's, without the caller's).
#[tokio::test]
async fn a_session_thread_that_outlives_its_run_cannot_call_that_runs_tools() {
    let (s, _dir) = server_with_tools("").await;
    let sid = s.new_session().await;
    let first = "from snakecage import tools
import threading
def names():
    return sorted(t['name'] for t in tools.list())
during = []
t = threading.Thread(target=lambda: during.extend(names()))
t.start(); t.join()
print('lookup_order' in during, 'never_answered' in during, len(during))
go = threading.Event()
outcome = []
def later():
    go.wait()
    try:
        tools.call('lookup_order', id=1)
    except tools.ToolError as e:
        outcome.append(type(e).__name__ + ': ' + e.message)
    outcome.append(names())
waiter = threading.Thread(target=later, daemon=True)
waiter.start()";
    let resp = s
        .client
        .post(format!("{}/v1/sessions/{sid}/execute/stream", s.base))
        .json(&json!({"code": first, "tools": declared()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains(r#""stdout":"True True 8\n""#), "{text}");
    // The next run declares no caller tools: neither the left-over thread nor the main
    // thread sees the first run's.
    let second = "go.set(); waiter.join()\nprint(outcome[0])\nprint(outcome[1] == names(), 'lookup_order' in names(), len(names()))";
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": second}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["stdout"],
        "UnknownToolError: unknown tool 'lookup_order'; this run offers: get_weather, convert_currency, moved, offsite, big, slow_lookup (tools.search(query) finds them by purpose)\nTrue False 6\n",
        "{r}"
    );
}

#[tokio::test]
async fn a_streamed_run_is_cancelled_by_delete() {
    let (s, _dir) = server_with_tools("").await;
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(60)", "timeout_ms": 60000}),
        )
        .await;
    let (event, _) = run.next().await.unwrap();
    assert_eq!(event, "output");
    let unknown = s
        .client
        .delete(format!("{}/v1/runs/run_unknown", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    assert_eq!(run.cancel().await, 204);
    let result = run.result().await;
    assert_eq!(result["verdict"], "killed", "{result}");
    assert!(
        result["stderr"].as_str().unwrap().contains("cancelled"),
        "{result}"
    );
    assert_eq!(run.cancel().await, 404);
}

#[tokio::test]
async fn a_session_interrupted_while_a_call_is_pending_keeps_its_state() {
    let (s, _dir) = server_with_tools("").await;
    let (status, session) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap();
    let (_, first) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "from snakecage import tools\nkept = 'ja'"}),
        )
        .await;
    assert_eq!(first["exit_code"], 0, "{first}");
    // A declared tool nobody answers, past the run's 1 s deadline (the call's own timeout
    // is 1.5 s): the job is interrupted, its pending call answered `cancelled`.
    let resp = s
        .client
        .post(format!("{}/v1/sessions/{id}/execute/stream", s.base))
        .json(&json!({"code": "tools.never_answered()", "tools": declared(), "timeout_ms": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: tool_call"), "{text}");
    assert!(text.contains(r#""timed_out":true"#), "{text}");
    let (_, after) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "print(kept, tools.get_weather(city='Aarau')['temp'])"}),
        )
        .await;
    assert_eq!(after["stdout"], "ja 5\n", "{after}");
    // DELETE /v1/runs/{id} on a session's run interrupts it; the session lives on.
    let mut run = s
        .stream(
            &format!("/v1/sessions/{id}/execute/stream"),
            &json!({"code": "import time\nprint('busy', flush=True)\ntime.sleep(30)", "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(run.next().await.unwrap().0, "output");
    assert_eq!(run.cancel().await, 204);
    let result = run.result().await;
    let stderr = result["stderr"].as_str().unwrap();
    assert!(stderr.contains("KeyboardInterrupt"), "{result}");
    // Said in so many words: it was the client's cancel, not the deadline or the program.
    assert!(
        stderr.ends_with(
            "\nThe run was cancelled by its client: interrupted, the session's state kept."
        ),
        "{result}"
    );
    assert_eq!(result["timed_out"], false, "{result}");
    let (_, again) = s
        .post(
            &format!("/v1/sessions/{id}/execute"),
            &json!({"code": "print(kept)"}),
        )
        .await;
    assert_eq!(again["stdout"], "ja\n", "{again}");
}
