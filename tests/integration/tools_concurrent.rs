//! Code Mode tool calls that run concurrently: a program's threads fan calls out and they
//! are in flight together (the host sees them at once), a waiting call releases the GIL,
//! the per-run cap holds, calls left in flight by a session's run or pending at an
//! interrupt are cancelled without a stale answer reaching a later call, caller tools are
//! answered in any order, and a worker that breaks the rules of calls in flight is killed.
//!
//! The tools are served by a loopback service that records how many requests it serves at
//! once; nothing here measures time: overlap is what the service saw.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::harness::{Options, Server};

/// What the tool service has seen.
#[derive(Default)]
pub(crate) struct Seen {
    /// `gate` requests being served now, and the most at once.
    pub(crate) gating: AtomicUsize,
    pub(crate) most_gating: AtomicUsize,
    gate_arrived: Notify,
    /// `hold` requests being served now.
    pub(crate) holding: AtomicUsize,
    released: AtomicBool,
    release: Notify,
}

/// Decrements a counter when a request ends, answered or dropped.
struct Leaving<'a>(&'a AtomicUsize);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `gate`: waits until `together` requests have been in at once (or `wait_ms` passed:
/// then it answers anyway), and answers its arguments with the most seen at once.
async fn gate(State(seen): State<Arc<Seen>>, Json(args): Json<Value>) -> Json<Value> {
    let together = args["together"].as_u64().unwrap_or(1) as usize;
    let wait = Duration::from_millis(args["wait_ms"].as_u64().unwrap_or(10_000));
    let now = seen.gating.fetch_add(1, Ordering::SeqCst) + 1;
    let _leaving = Leaving(&seen.gating);
    seen.most_gating.fetch_max(now, Ordering::SeqCst);
    seen.gate_arrived.notify_waiters();
    let give_up = tokio::time::sleep(wait);
    tokio::pin!(give_up);
    loop {
        let arrived = seen.gate_arrived.notified();
        if seen.most_gating.load(Ordering::SeqCst) >= together {
            break;
        }
        tokio::select! {
            () = arrived => {}
            () = &mut give_up => break,
        }
    }
    Json(json!({"city": args["city"], "seen": seen.most_gating.load(Ordering::SeqCst)}))
}

/// `hold`: waits for `release` (or 20 s) and says whether it was released.
async fn hold(State(seen): State<Arc<Seen>>, Json(args): Json<Value>) -> Json<Value> {
    seen.holding.fetch_add(1, Ordering::SeqCst);
    let _leaving = Leaving(&seen.holding);
    let give_up = tokio::time::sleep(Duration::from_secs(20));
    tokio::pin!(give_up);
    loop {
        let release = seen.release.notified();
        if seen.released.load(Ordering::SeqCst) {
            break;
        }
        tokio::select! {
            () = release => {}
            () = &mut give_up => break,
        }
    }
    Json(json!({"tag": args["tag"], "released": seen.released.load(Ordering::SeqCst)}))
}

async fn tool_service(seen: Arc<Seen>) -> String {
    let app = axum::Router::new()
        .route("/gate", post(gate))
        .route("/hold", post(hold))
        .route(
            "/release",
            post(|State(seen): State<Arc<Seen>>| async move {
                seen.released.store(true, Ordering::SeqCst);
                seen.release.notify_waiters();
                Json(json!({}))
            }),
        )
        .route(
            "/status",
            get(|State(seen): State<Arc<Seen>>| async move {
                Json(json!({"holding": seen.holding.load(Ordering::SeqCst)}))
            }),
        )
        .route(
            "/echo",
            post(|Json(args): Json<Value>| async move { Json(args) }),
        )
        .with_state(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A server whose tools are the loopback service's, with `extra` in `[tools]`.
pub(crate) async fn server(extra: &str) -> (Server, Arc<Seen>, tempfile::TempDir) {
    let seen = Arc::new(Seen::default());
    let base = tool_service(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let tool = |name: &str, method: &str| {
        format!(
            "[[tools.http]]\nname = \"{name}\"\ndescription = \"{name}\"\nurl = \"{base}/{name}\"\nmethod = \"{method}\"\n"
        )
    };
    let config = format!(
        "[tools]\ncall_timeout_ms = 30000\n{extra}\n\n{}{}{}{}{}",
        tool("gate", "POST"),
        tool("hold", "POST"),
        tool("release", "POST"),
        tool("status", "GET"),
        tool("echo", "POST"),
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let server =
        Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;
    (server, seen, dir)
}

/// Runs `code` in session `sid` with room to spare (the default deadline is 2 s).
pub(crate) async fn session_run(s: &Server, sid: &str, code: &str) -> Value {
    let (status, r) = s
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": code, "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    r
}

pub(crate) fn stdout(body: &Value) -> &str {
    body["stdout"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn calls_fanned_out_over_threads_are_in_flight_together_and_each_gets_its_answer() {
    let (s, seen, _dir) = server("").await;
    // Each call waits until all five are in at once: they pass only when they overlap.
    let code = "from snakecage import tools
from concurrent.futures import ThreadPoolExecutor
cities = ['Zürich', 'Genève', '東京', 'Aïre', 'Biel/Bienne']
with ThreadPoolExecutor(max_workers=5) as pool:
    answers = list(pool.map(lambda c: tools.gate(city=c, together=5), cities))
print([a['city'] for a in answers] == cities, answers[2]['city'], min(a['seen'] for a in answers))";
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(stdout(&body), "True 東京 5\n", "{body}");
    assert_eq!(seen.most_gating.load(Ordering::SeqCst), 5);
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics
            .contains(r#"snakecage_tool_calls_total{outcome="ok",provider="http",tool="gate"} 5"#),
        "{metrics}"
    );
}

/// The fan-out an agent writes with asyncio: `tools.aio` calls gathered at top level, in a
/// stateless run and in a session (where the loop outlives the run).
#[tokio::test]
async fn calls_gathered_with_asyncio_are_in_flight_together() {
    let (s, seen, _dir) = server("").await;
    let code = "import asyncio
from snakecage import tools
cities = ['Zürich', 'Genève', '東京', 'Aïre']
answers = await asyncio.gather(*(tools.aio.gate(city=c, together=4) for c in cities))
print([a['city'] for a in answers] == cities, answers[2]['city'], min(a['seen'] for a in answers))
try:
    await tools.acall('nope')
except tools.UnknownToolError as e:
    print(type(e).__name__)";
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(stdout(&body), "True 東京 4\nUnknownToolError\n", "{body}");
    assert_eq!(body["verdict"], "ok", "{body}");
    assert_eq!(seen.most_gating.load(Ordering::SeqCst), 4);

    let sid = s.new_session().await;
    let r = session_run(&s, &sid, "import asyncio\nfrom snakecage import tools").await;
    assert_eq!(r["exit_code"], 0, "{r}");
    for round in 0..2 {
        // Each round's calls must meet each other, not an earlier round's record.
        seen.most_gating.store(0, Ordering::SeqCst);
        let r = session_run(
            &s,
            &sid,
            "answers = await asyncio.gather(*(tools.aio.gate(city=c, together=4) for c in 'αβγδ'))\n''.join(a['city'] for a in answers)",
        )
        .await;
        assert_eq!(
            r["results"],
            json!([{"text/plain": "'αβγδ'"}]),
            "round {round}: {r}"
        );
        assert_eq!(seen.most_gating.load(Ordering::SeqCst), 4, "round {round}");
    }
}

/// The fan-out an agent often writes: an executor never shut down (no `with`). The run
/// ends with its program, as `python __main__.py` would, not at its deadline.
#[tokio::test]
async fn a_fan_out_over_an_executor_never_shut_down_ends_with_the_program() {
    let (s, _seen, _dir) = server("").await;
    let code = "from snakecage import tools
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(4)
print([a['city'] for a in pool.map(lambda c: tools.gate(city=c, together=2), ['Chur', 'Sion'])])";
    let body = s.run_with(json!({"code": code, "timeout_ms": 30000})).await;
    assert_eq!(stdout(&body), "['Chur', 'Sion']\n", "{body}");
    assert_eq!(body["verdict"], "ok", "{body}");
}

/// While one thread's call waits, another thread runs Python (here: counts, then makes
/// calls of its own): the waiting call does not hold the GIL.
#[tokio::test]
async fn a_waiting_call_lets_the_programs_other_threads_run() {
    let (s, seen, _dir) = server("").await;
    let code = "from snakecage import tools
import threading
held = []
t = threading.Thread(target=lambda: held.append(tools.hold(tag='A')))
t.start()
while tools.status()['holding'] < 1:
    pass
n = 0
while n < 200000:
    n += 1
tools.release()
t.join()
print(n, held[0]['released'])";
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(stdout(&body), "200000 True\n", "{body}");
    assert_eq!(seen.holding.load(Ordering::SeqCst), 0);
}

/// With `max_concurrent_calls = 2` the host never sees more than two calls of a run at
/// once, however many threads call; the calls past the cap wait and then succeed, and
/// `max_calls_per_run` still counts every call.
#[tokio::test]
async fn the_cap_on_calls_in_flight_holds_and_calls_past_it_wait() {
    let (s, seen, _dir) = server("max_concurrent_calls = 2\nmax_calls_per_run = 6").await;
    // Each call waits for a third in flight, which never comes, then answers: the first two
    // are in flight together for 1.5 s.
    let code = "from snakecage import tools
from concurrent.futures import ThreadPoolExecutor
def one(i):
    try:
        return tools.gate(city=f'Stadt {i}', together=3, wait_ms=1500)['city']
    except tools.ToolLimitError as e:
        return 'limit'
with ThreadPoolExecutor(max_workers=8) as pool:
    got = list(pool.map(one, range(8)))
print(got.count('limit'), len(set(got) - {'limit'}),
      all(g in ('limit', f'Stadt {i}') for i, g in enumerate(got)))";
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    // Six calls (any six) answered with their own arguments, two refused by the limit.
    assert_eq!(stdout(&body), "2 6 True\n", "{body}");
    assert_eq!(seen.most_gating.load(Ordering::SeqCst), 2);
}

/// A session's run that ends with calls in flight: each is answered `cancelled` (the
/// threads that made them go on), and the next run's own call gets its own answer.
#[tokio::test]
async fn calls_in_flight_when_a_sessions_run_ends_are_cancelled_and_the_next_run_is_unharmed() {
    let (s, seen, _dir) = server("").await;
    let sid = s.new_session().await;
    let first = "from snakecage import tools
import threading
outcomes = []
def hold(i):
    try:
        outcomes.append(('ok', tools.hold(tag=f'Faden {i}')))
    except tools.ToolError as e:
        outcomes.append((e.kind, e.message))
threads = [threading.Thread(target=hold, args=(i,), daemon=True) for i in range(3)]
for t in threads:
    t.start()
while tools.status()['holding'] < 3:
    pass
print('holding 3')";
    let r = session_run(&s, &sid, first).await;
    assert_eq!(stdout(&r), "holding 3\n", "{r}");
    let second = "for t in threads:
    t.join()
print(sorted(set(outcomes)), len(outcomes))
print(tools.echo(word='zwei ✓')['word'])";
    let r = session_run(&s, &sid, second).await;
    assert_eq!(
        stdout(&r),
        "[('cancelled', 'the run ended while this call was pending')] 3\nzwei ✓\n",
        "{r}"
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    let third = session_run(&s, &sid, "print(tools.echo(n=3)['n'], len(outcomes))").await;
    assert_eq!(stdout(&third), "3 3\n", "{third}");
    assert!(!seen.released.load(Ordering::SeqCst));
}

/// An interrupt (here `DELETE /v1/runs/{id}` on a session's streamed run) answers every
/// pending call `cancelled`; the program catches the interrupt, sees each outcome, and the
/// session goes on.
#[tokio::test]
async fn an_interrupt_cancels_every_pending_call() {
    let (s, _seen, _dir) = server("").await;
    let sid = s.new_session().await;
    let code = "from snakecage import tools
import threading
outcomes = []
def hold(i):
    try:
        outcomes.append(('ok', tools.hold(tag=i)))
    except tools.ToolError as e:
        outcomes.append((e.kind, e.message))
threads = [threading.Thread(target=hold, args=(i,)) for i in range(3)]
for t in threads:
    t.start()
while tools.status()['holding'] < 3:
    pass
print('holding', flush=True)
try:
    threading.Event().wait()
except KeyboardInterrupt:
    print('interrupted')
for t in threads:
    t.join()
print(sorted(set(outcomes)), len(outcomes))";
    let result = s
        .stream(
            &format!("/v1/sessions/{sid}/execute/stream"),
            &json!({"code": code, "timeout_ms": 60000}),
        )
        .await
        .cancel_when(|event, data| event == "output" && data["data"] == "holding\n")
        .await;
    assert_eq!(
        stdout(&result),
        "holding\ninterrupted\n[('cancelled', 'the run was interrupted while this call was pending')] 3\n",
        "{result}"
    );
    let after = session_run(&s, &sid, "print(tools.echo(word='danach')['word'])").await;
    assert_eq!(stdout(&after), "danach\n", "{after}");
}

/// Two calls of declared tools outstanding at once, answered by the client in reverse
/// order: each answer reaches its own call.
#[tokio::test]
async fn caller_tools_outstanding_together_are_answered_in_any_order() {
    let (s, _seen, _dir) = server("").await;
    let declared = json!([{"name": "lookup_order", "description": "An order by id",
        "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}]);
    let code = "from snakecage import tools
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(2) as pool:
    first = pool.submit(tools.lookup_order, id=1)
    second = pool.submit(tools.lookup_order, id=2)
    print(first.result()['amount'], '|', second.result()['amount'])";
    let mut run = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "tools": declared, "timeout_ms": 60000}),
        )
        .await;
    let mut calls: Vec<(i64, String)> = Vec::new();
    let result = run
        .answer_calls(async |run, call| {
            let id = call["arguments"]["id"].as_i64().unwrap();
            calls.push((id, call["call_id"].as_str().unwrap().to_owned()));
            if calls.len() == 2 {
                // Both are outstanding: answer the later one first.
                calls.sort();
                for (id, call) in calls.iter().rev() {
                    let amount = if *id == 1 { "eins €" } else { "zwei €" };
                    let (status, body) = run
                        .answer_id(call, &json!({"result": {"amount": amount}}))
                        .await;
                    assert_eq!(status, 204, "{body}");
                }
            }
        })
        .await;
    assert_eq!(calls.len(), 2, "{result}");
    assert_eq!(stdout(&result), "eins € | zwei €\n", "{result}");
}

/// Frames written to the job socket by user code that break the rules of calls in
/// flight: an id that is already pending, and more calls at once than the cap. Each
/// kills the worker with a message that says which.
#[tokio::test]
async fn a_worker_breaking_the_rules_of_calls_in_flight_is_killed() {
    let (s, _seen, _dir) = server("max_concurrent_calls = 2").await;
    let frames = |ids: &str| {
        format!(
            "import os, json, time
frames = b''
for i in {ids}:
    m = json.dumps({{'type': 'tool_call', 'id': i, 'name': 'hold', 'arguments': {{'tag': 'x'}}}}).encode()
    frames += len(m).to_bytes(4, 'little') + m
os.write(3, frames)
time.sleep(60)"
        )
    };
    for (ids, why) in [
        (
            "[7, 7]",
            "a tool call with id 7 while a call with that id was pending",
        ),
        (
            "[1, 2, 3]",
            "more tool calls in flight at once than the 2 allowed (tools.max_concurrent_calls)",
        ),
    ] {
        let body = s
            .run_with(json!({"code": frames(ids), "timeout_ms": 60000}))
            .await;
        assert_eq!(body["verdict"], "killed", "{body}");
        assert_eq!(body["exit_code"], Value::Null, "{body}");
        assert_eq!(stdout(&body), "", "{body}");
        assert_eq!(
            body["stderr"],
            format!(
                "\nThe worker broke the job protocol and was killed: its job socket (fd 3) \
                 carried {why}, which is what a job writing to fd 3 causes."
            ),
            "{body}"
        );
    }
    let metrics = s.get("/metrics").await.2;
    assert!(
        metrics.contains(r#"snakecage_workers_killed_total{reason="protocol_violation"} 2"#),
        "{metrics}"
    );
    // Within the cap, distinct ids are no violation (their answers go to nobody).
    let body = s
        .run_with(json!({"code": frames("[1, 2]").replace("time.sleep(60)", "print('ok')"), "timeout_ms": 60000}))
        .await;
    assert_eq!(stdout(&body), "ok\n", "{body}");
    assert_eq!(body["verdict"], "ok", "{body}");
}

/// A program that writes calls to fd 3 and never reads their answers fills its socket's
/// buffer; the supervisor's answers then cannot go out. That must not hold the run past
/// its deadline (before, it held the request and its pool slot until the client left).
#[tokio::test]
async fn a_worker_that_never_reads_its_answers_still_ends_at_its_deadline() {
    let (s, _seen, _dir) = server("").await;
    let code = "import os, json, struct, time
for i in range(600):
    b = json.dumps({'type': 'tool_call', 'id': 10000 + i, 'name': 'nosuch', 'arguments': {'é': i}}).encode()
    os.write(3, struct.pack('<I', len(b)) + b)
print('écrit', flush=True)
time.sleep(30)";
    let client = s.client.clone();
    let url = format!("{}/v1/execute", s.base);
    let body: Value = tokio::time::timeout(
        Duration::from_secs(20),
        client
            .post(url)
            .json(&json!({"code": code, "timeout_ms": 2000}))
            .send(),
    )
    .await
    .expect("the run must end at its deadline, not when the client gives up")
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(body["verdict"], "timeout", "{body}");
    // (Its own writes to fd 3 block too once the supervisor is stuck: `écrit` may never
    // be printed, which is the program's business.)
    // The slot is free again.
    let next = s.run("print(6 * 7)").await;
    assert_eq!(stdout(&next), "42\n", "{next}");
}
