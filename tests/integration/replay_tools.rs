//! Replay sessions whose runs called tools (Code Mode): a replay answers each call from the
//! session's journal and never calls a tool again — neither an operator's HTTP tool (the
//! service counts what it serves) nor a tool the caller answers (no `tool_call` event
//! reaches the client). Concurrent calls replay in any order; calls left pending when a
//! run ended stay pending in its replay; code whose tool arguments differ on replay ends
//! its session (410) naming the tool; tool results count toward `replay_max_bytes`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

use crate::harness::{Options, Server};
use crate::replay::{kill_worker, worker_pid};

/// What the tool service has served.
#[derive(Default)]
struct Served {
    /// Every request, of any tool.
    calls: AtomicUsize,
    /// `hold` requests being served now.
    holding: AtomicUsize,
}

impl Served {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Decrements a counter when a request ends, answered or dropped.
struct Leaving<'a>(&'a AtomicUsize);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn tool_service(served: Arc<Served>) -> String {
    let app = axum::Router::new()
        // Numbers its answers: an answer given again by the service would show.
        .route(
            "/quote",
            post(
                |State(served): State<Arc<Served>>, Json(args): Json<Value>| async move {
                    let n = served.calls.fetch_add(1, Ordering::SeqCst) + 1;
                    if args["item"] == "" {
                        let refused = json!({"message": "kein Artikel", "n": n});
                        return (axum::http::StatusCode::UNPROCESSABLE_ENTITY, Json(refused));
                    }
                    let answer = json!({"item": args["item"], "n": n, "gruß": "grüezi ✓"});
                    (axum::http::StatusCode::OK, Json(answer))
                },
            ),
        )
        .route(
            "/blob",
            post(
                |State(served): State<Arc<Served>>, Json(args): Json<Value>| async move {
                    served.calls.fetch_add(1, Ordering::SeqCst);
                    let size = args["size"].as_u64().unwrap_or(0) as usize;
                    Json(json!({"blob": "é".repeat(size)}))
                },
            ),
        )
        // Answers long after any run here has ended.
        .route(
            "/hold",
            post(|State(served): State<Arc<Served>>| async move {
                served.calls.fetch_add(1, Ordering::SeqCst);
                served.holding.fetch_add(1, Ordering::SeqCst);
                let _leaving = Leaving(&served.holding);
                tokio::time::sleep(Duration::from_secs(60)).await;
                Json(json!({"held": true}))
            }),
        )
        .route(
            "/status",
            post(|State(served): State<Arc<Served>>| async move {
                served.calls.fetch_add(1, Ordering::SeqCst);
                Json(json!({"holding": served.holding.load(Ordering::SeqCst)}))
            }),
        )
        .with_state(served);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A server whose HTTP tools are the counting service's, with `options` added.
async fn server(options: Options) -> (Server, Arc<Served>, tempfile::TempDir) {
    let served = Arc::new(Served::default());
    let base = tool_service(served.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let tool = |name: &str| {
        format!(
            "[[tools.http]]\nname = \"{name}\"\ndescription = \"{name}\"\nurl = \"{base}/{name}\"\nmethod = \"POST\"\n"
        )
    };
    let config = format!(
        "[tools]\ncall_timeout_ms = 30000\n\n{}{}{}{}",
        tool("quote"),
        tool("blob"),
        tool("hold"),
        tool("status"),
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let server = Server::start_with(options.env("SNAKECAGE_CONFIG", path.display())).await;
    (server, served, dir)
}

async fn replay_session(s: &Server) -> String {
    let (status, r) = s.post("/v1/sessions", &json!({"replay": true})).await;
    assert_eq!(status, 201, "{r}");
    r["session_id"].as_str().unwrap().to_owned()
}

/// Runs `code` in session `sid` with room to spare; it must succeed at the HTTP level.
async fn run(s: &Server, sid: &str, code: &str) -> Value {
    let (status, r) = exec(s, sid, code).await;
    assert_eq!(status, 200, "{r}");
    r
}

async fn exec(s: &Server, sid: &str, code: &str) -> (u16, Value) {
    s.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"code": code, "timeout_ms": 30000}),
    )
    .await
}

fn stdout(body: &Value) -> &str {
    body["stdout"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_runs_http_tool_calls_are_replayed_from_the_journal_not_made_again() {
    let (s, served, _dir) = server(Options::default()).await;
    let sid = replay_session(&s).await;
    let r = run(
        &s,
        &sid,
        "from snakecage import tools
q = tools.quote(item='Käse 🧀')
try:
    tools.quote(item='')
except tools.ToolError as e:
    refused = (e.kind, e.data['n'])
print(q['n'], refused)",
    )
    .await;
    assert_eq!(stdout(&r), "1 ('failed', 2)\n", "{r}");
    let r = run(
        &s,
        &sid,
        "label = f\"{q['item']} #{q['n']} {q['gruß']} {refused}\"",
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(served.calls(), 2);
    let pid = worker_pid(&s, &sid).await;
    kill_worker(pid).await;

    let r = run(&s, &sid, "print(label)").await;
    // Built from the journaled answers: the ok one and the error alike.
    assert_eq!(stdout(&r), "Käse 🧀 #1 grüezi ✓ ('failed', 2)\n", "{r}");
    assert_eq!(r["replayed"], 3, "{r}");
    assert!(
        r["notice"]
            .as_str()
            .unwrap()
            .contains("tool calls, if any, were answered from the session's journal"),
        "{r}"
    );
    // The replay called nothing: the service saw the original two calls only.
    assert_eq!(served.calls(), 2);
    // The session's tools are live again for its own runs.
    let r = run(&s, &sid, "print(tools.quote(item='danach')['n'])").await;
    assert_eq!(stdout(&r), "3\n", "{r}");
}

/// Runs `code` in session `sid` over SSE with the declared `lookup_order` tool, answering
/// each of its calls with `answer(arguments)`. Returns the result and the calls asked.
async fn stream_run(
    s: &Server,
    sid: &str,
    code: &str,
    answer: impl Fn(&Value) -> Value,
) -> (Value, Vec<Value>) {
    let declared = json!([{"name": "lookup_order", "description": "An order by id",
        "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}]);
    let mut run = s
        .stream(
            &format!("/v1/sessions/{sid}/execute/stream"),
            &json!({"code": code, "tools": declared, "timeout_ms": 30000}),
        )
        .await;
    let mut asked = Vec::new();
    let result = run
        .answer_calls(async |run, call| {
            let (status, body) = run.answer(call, &answer(&call["arguments"])).await;
            assert_eq!(status, 204, "{body}");
            asked.push(call["arguments"].clone());
        })
        .await;
    let unexpected = run.events_other_than(&["output", "tool_call", "result"]);
    assert!(unexpected.is_empty(), "unexpected events: {unexpected:?}");
    (result, asked)
}

#[tokio::test]
async fn a_runs_caller_tool_calls_are_replayed_without_asking_the_client_again() {
    let (s, _served, _dir) = server(Options::default()).await;
    let sid = replay_session(&s).await;
    let answer = |args: &Value| match args["id"].as_i64() {
        Some(7) => json!({"result": {"id": 7, "owner": "Zoë", "items": ["café", "naïve"]}}),
        _ => json!({"error": {"message": "keine Bestellung", "data": {"id": args["id"]}}}),
    };
    let code = "from snakecage import tools
order = tools.lookup_order(id=7)
try:
    tools.lookup_order(id=99)
except tools.ToolError as e:
    missing = (e.message, e.data)
summary = f\"{order['owner']}: {', '.join(order['items'])} | {missing}\"
print(summary)";
    let (r, asked) = stream_run(&s, &sid, code, answer).await;
    assert_eq!(
        stdout(&r),
        "Zoë: café, naïve | ('keine Bestellung', {'id': 99})\n",
        "{r}"
    );
    assert_eq!(asked, [json!({"id": 7}), json!({"id": 99})]);
    let pid = worker_pid(&s, &sid).await;
    kill_worker(pid).await;

    // The same client, with the same tool declared, is asked nothing during the replay.
    let (r, asked) = stream_run(&s, &sid, "print(summary)", answer).await;
    assert_eq!(
        stdout(&r),
        "Zoë: café, naïve | ('keine Bestellung', {'id': 99})\n",
        "{r}"
    );
    assert_eq!(r["replayed"], 2, "{r}");
    assert!(asked.is_empty(), "{asked:?}");
    // Nor over plain /v1/execute, where nobody could answer.
    let pid = worker_pid(&s, &sid).await;
    kill_worker(pid).await;
    let r = run(&s, &sid, "print(order['owner'])").await;
    assert_eq!(stdout(&r), "Zoë\n", "{r}");
    assert_eq!(r["replayed"], 4, "{r}");
}

/// Calls fanned out over asyncio and threads reach the host in an order of their own each
/// time; each replayed call gets the answer its own arguments got.
#[tokio::test]
async fn concurrent_tool_calls_replay_whatever_order_they_come_in() {
    let (s, served, _dir) = server(Options::default()).await;
    let sid = replay_session(&s).await;
    let code = "import asyncio
from concurrent.futures import ThreadPoolExecutor
from snakecage import tools
items = ['Zürich', 'Genève', '東京', 'Aïre', 'Biel/Bienne', 'Chur']
gathered = await asyncio.gather(*(tools.aio.quote(item=c) for c in items[:3]))
with ThreadPoolExecutor(3) as pool:
    threaded = list(pool.map(lambda c: tools.quote(item=c), items[3:]))
numbers = {a['item']: a['n'] for a in gathered + threaded}
print(sorted(numbers.values()))";
    let r = run(&s, &sid, code).await;
    assert_eq!(stdout(&r), "[1, 2, 3, 4, 5, 6]\n", "{r}");
    let before = run(&s, &sid, "print(numbers)").await;
    for round in 0..2 {
        let pid = worker_pid(&s, &sid).await;
        kill_worker(pid).await;
        let r = run(&s, &sid, "print(numbers)").await;
        assert_eq!(r["stdout"], before["stdout"], "round {round}: {r}");
        assert!(r["replayed"].as_u64().unwrap() >= 2, "round {round}: {r}");
    }
    assert_eq!(served.calls(), 6);
}

/// A call still pending when a run ended was answered `cancelled` by the run's end; its
/// replay is left pending likewise (the tool is not called, and the thread that made it
/// sees the same outcome).
#[tokio::test]
async fn a_call_pending_when_its_run_ended_is_cancelled_again_in_the_replay() {
    let (s, served, _dir) = server(Options::default()).await;
    let sid = replay_session(&s).await;
    let first = "import threading, time
from snakecage import tools
outcomes = []
def hold():
    try:
        outcomes.append(('ok', tools.hold(tag='Fädchen')))
    except tools.ToolError as e:
        outcomes.append((e.kind, e.message))
thread = threading.Thread(target=hold, daemon=True)
thread.start()
while tools.status()['holding'] < 1:
    time.sleep(0.01)
time.sleep(0.05)";
    let r = run(&s, &sid, first).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = run(&s, &sid, "thread.join()\nprint(outcomes)").await;
    let expected = "[('cancelled', 'the run ended while this call was pending')]\n";
    assert_eq!(stdout(&r), expected, "{r}");
    let calls = served.calls();
    let pid = worker_pid(&s, &sid).await;
    kill_worker(pid).await;

    let r = run(&s, &sid, "thread.join()\nprint(outcomes)").await;
    assert_eq!(stdout(&r), expected, "{r}");
    assert_eq!(r["replayed"], 3, "{r}");
    assert_eq!(served.calls(), calls, "the replay called a tool");
}

#[tokio::test]
async fn a_replay_whose_tool_arguments_differ_ends_the_session_naming_the_tool() {
    let (s, served, _dir) = server(Options::default()).await;
    let sid = replay_session(&s).await;
    run(&s, &sid, "x = 'ünïcode'").await;
    let r = run(
        &s,
        &sid,
        "import random\nfrom snakecage import tools\nticket = tools.quote(item=f'Los Nr. {random.randrange(10**12)}')",
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let pid = worker_pid(&s, &sid).await;
    kill_worker(pid).await;

    let (status, r) = exec(&s, &sid, "print(x)").await;
    assert_eq!(status, 410, "{r}");
    assert_eq!(r["code"], "session_gone", "{r}");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains(
            "the replay of run 2 of 3 called tool 'quote' with arguments the original run did not use ({\"item\":\"Los Nr. "
        ) && detail.contains("never calls a tool again"),
        "{detail}"
    );
    // The diverging call was not made either.
    assert_eq!(served.calls(), 1);
    let (status, r) = s.get_json(&format!("/v1/sessions/{sid}")).await;
    assert_eq!(status, 410, "{r}");
}

#[tokio::test]
async fn tool_results_count_toward_replay_max_bytes() {
    let (s, _served, _dir) =
        server(Options::default().env("SNAKECAGE_SESSIONS__REPLAY_MAX_BYTES", 4000)).await;
    let sid = replay_session(&s).await;
    // Small answers fit.
    let r = run(
        &s,
        &sid,
        "from snakecage import tools\nsmall = tools.blob(size=100)['blob']",
    )
    .await;
    assert!(r.get("notice").is_none(), "{r}");
    // Little code, a 4 KB answer ("é" is two bytes): the journal overflows.
    let r = run(&s, &sid, "big = tools.blob(size=2000)['blob']").await;
    let notice = r["notice"].as_str().unwrap_or_default();
    assert!(
        notice.contains("can no longer be replayed")
            && notice.contains("bytes of code and tool calls (sessions.replay_max_bytes)"),
        "{r}"
    );
    let pid = worker_pid(&s, &sid).await;
    kill_worker(pid).await;
    let (status, r) = exec(&s, &sid, "print(len(big))").await;
    assert_eq!(status, 410, "{r}");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("past 4000 bytes of code and tool calls"),
        "{r}"
    );
}
