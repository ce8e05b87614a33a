//! Code Mode calls that end without their answer: each is counted once in
//! `snakecage_tool_calls_total` (outcome `cancelled`) and in the duration histogram,
//! whatever cancelled it (the run's end, its deadline, `DELETE /v1/runs/{id}`) and
//! whoever provides the tool (an HTTP tool, an upstream MCP server, the caller).

use serde_json::{Value, json};

use crate::harness::{Options, Server, repo_root};
use crate::tools_concurrent::{server, session_run, stdout};

/// The value of the sample `name{labels}` in the metrics text (0 when absent).
pub(crate) fn sample(metrics: &str, name_and_labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The calls of `tool` (provider `provider`) counted with `outcome` in
/// `snakecage_tool_calls_total`.
fn counted(metrics: &str, outcome: &str, provider: &str, tool: &str) -> f64 {
    sample(
        metrics,
        &format!(
            r#"snakecage_tool_calls_total{{outcome="{outcome}",provider="{provider}",tool="{tool}"}}"#
        ),
    )
}

/// The calls counted for `provider` in `snakecage_tool_calls_total`, every tool and
/// outcome together.
fn calls_of(metrics: &str, provider: &str) -> f64 {
    let label = format!("provider=\"{provider}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("snakecage_tool_calls_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every call counted is in the duration histogram too, once.
fn assert_histogram_counts_every_call(metrics: &str, provider: &str) {
    let counted = calls_of(metrics, provider);
    let timed = sample(
        metrics,
        &format!("snakecage_tool_call_duration_seconds_count{{provider=\"{provider}\"}}"),
    );
    assert_eq!(timed, counted, "{provider}: {metrics}");
}

/// One HTTP tool's calls cancelled three ways, and a declared tool's call cancelled by
/// `DELETE`: each is counted `cancelled`, and timed.
#[tokio::test]
async fn calls_cancelled_by_the_runs_end_its_deadline_or_a_delete_are_counted_cancelled() {
    let (s, _seen, _dir) = server("").await;
    let hold = r#"snakecage_tool_calls_total{outcome="cancelled",provider="http",tool="hold"}"#;

    // 1. A one-shot run that ends with a call in flight on a thread of its own.
    let code = "from snakecage import tools
import threading
threading.Thread(target=lambda: tools.hold(tag='Ende'), daemon=True).start()
while tools.status()['holding'] < 1:
    pass
print('fertig')";
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(stdout(&body), "fertig\n", "{body}");
    assert_eq!(sample(&s.get("/metrics").await.2, hold), 1.0);

    // 2. A session's run interrupted at its deadline while its call waits.
    let sid = s.new_session().await;
    let (status, body) = s
        .post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": "from snakecage import tools\ntools.hold(tag='Frist')", "timeout_ms": 3000}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(sample(&s.get("/metrics").await.2, hold), 2.0);

    // 3. A one-shot streamed run cancelled with DELETE while its call waits.
    let code = "from snakecage import tools
import threading
threading.Thread(target=lambda: tools.hold(tag='Abbruch'), daemon=True).start()
while tools.status()['holding'] < 1:
    pass
print('holding', flush=True)
threading.Event().wait()";
    let result = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": code, "timeout_ms": 60000}),
        )
        .await
        .cancel_when(|event, data| event == "output" && data["data"] == "holding\n")
        .await;
    assert_eq!(result["verdict"], "killed", "{result}");
    let metrics = s.get("/metrics").await.2;
    assert_eq!(sample(&metrics, hold), 3.0, "{metrics}");
    assert_histogram_counts_every_call(&metrics, "http");

    // 4. A declared tool's call, outstanding at the client, when the run is cancelled.
    let declared = json!([{"name": "ask", "parameters": {"type": "object"}}]);
    let result = s
        .stream(
            "/v1/execute/stream",
            &json!({"code": "from snakecage import tools\ntools.ask()", "tools": declared, "timeout_ms": 60000}),
        )
        .await
        .cancel_when(|event, _| event == "tool_call")
        .await;
    assert_eq!(result["verdict"], "killed", "{result}");
    let metrics = s.get("/metrics").await.2;
    assert_eq!(
        counted(&metrics, "cancelled", "caller", "caller"),
        1.0,
        "{metrics}"
    );
    assert_histogram_counts_every_call(&metrics, "caller");
    // The interrupted session goes on.
    let after = session_run(&s, &sid, "print(tools.echo(w='danach')['w'])").await;
    assert_eq!(stdout(&after), "danach\n", "{after}");
}

/// A call of an upstream MCP tool pending at a one-shot run's deadline is counted
/// `cancelled` with its tool and provider.
#[tokio::test]
async fn an_mcp_call_pending_at_the_deadline_is_counted_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let python = repo_root().join(".venv-tools/bin/python");
    let script = repo_root().join("tests/clients/mcp_upstream.py");
    let config = format!(
        "[[tools.mcp]]\nname = \"calc\"\ncommand = [{:?}, {:?}]\n",
        python.display().to_string(),
        script.display().to_string(),
    );
    let path = dir.path().join("snakecage.toml");
    std::fs::write(&path, config).unwrap();
    let s = Server::start_with(Options::default().env("SNAKECAGE_CONFIG", path.display())).await;
    let code = "from snakecage import tools
print(tools.calc_add(a=1, b=2)['sum'], flush=True)
tools.calc_wait(seconds=120)";
    let body = s.run_with(json!({"code": code, "timeout_ms": 3000})).await;
    assert_eq!(stdout(&body), "3\n", "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    let metrics = s.get("/metrics").await.2;
    assert_eq!(
        counted(&metrics, "cancelled", "mcp", "calc_wait"),
        1.0,
        "{metrics}"
    );
    assert_eq!(counted(&metrics, "ok", "mcp", "calc_add"), 1.0, "{metrics}");
    assert_histogram_counts_every_call(&metrics, "mcp");
}

/// A call the supervisor refuses before dispatching it (here: past
/// `tools.max_calls_per_run`) is labelled with its tool's provider, not `none`.
#[tokio::test]
async fn a_call_refused_by_a_limit_is_labelled_with_its_tools_provider() {
    let (s, _seen, _dir) = server("max_calls_per_run = 1").await;
    let code = "from snakecage import tools
print(tools.echo(n=1)['n'])
try:
    tools.echo(n=2)
except tools.ToolLimitError as e:
    print(e.kind)";
    let body = s.run(code).await;
    assert_eq!(stdout(&body), "1\nlimit\n", "{body}");
    let metrics = s.get("/metrics").await.2;
    assert_eq!(counted(&metrics, "limit", "http", "echo"), 1.0, "{metrics}");
    assert_eq!(calls_of(&metrics, "none"), 0.0, "{metrics}");
    assert_histogram_counts_every_call(&metrics, "http");
}

/// Python that speaks the job protocol on fd 3 itself, as hostile code can: `send(msg)`
/// writes a frame, `frames(msgs)` encodes several, `recv()` reads the next answer.
const RAW_FRAMES: &str = "import os, json, struct
def frame(m):
    b = json.dumps(m).encode()
    return struct.pack('<I', len(b)) + b
def frames(msgs):
    return b''.join(frame(m) for m in msgs)
def send(m):
    os.write(3, frames([m]))
def read_exact(n):
    b = b''
    while len(b) < n:
        chunk = os.read(3, n - len(b))
        if not chunk:
            raise EOFError('the supervisor hung up')
        b += chunk
    return b
def recv():
    return json.loads(read_exact(struct.unpack('<I', read_exact(4))[0]))
def call(i, name, **arguments):
    send({'type': 'tool_call', 'id': i, 'name': name, 'arguments': arguments})
def cancel(i):
    send({'type': 'tool_cancel', 'id': i})
";

/// Cancels written to fd 3 by hostile code: one for an id already answered, one for an
/// id never made, one twice, and a flood of them. A pending call is dropped and answered
/// `cancelled` once; every other cancel is ignored: no id gets a second answer, and the
/// calls after them get their own.
#[tokio::test]
async fn cancels_of_ids_not_pending_are_ignored_and_no_call_is_answered_twice() {
    let (s, _seen, _dir) = server("").await;
    let code = format!(
        "{RAW_FRAMES}
call(1, 'echo', n=1)
first = recv()
cancel(1)
cancel(99)
call(2, 'hold', tag='x')
cancel(2)
cancel(2)
held = recv()
call(3, 'echo', n=3)
third = recv()
os.write(3, frames({{'type': 'tool_cancel', 'id': i % 5}} for i in range(100000)))
call(4, 'echo', n=4)
fourth = recv()
print(first['id'], first['result'], '|', held['id'], held['kind'], held['message'], '|',
      third['id'], third['result'], '|', fourth['id'], fourth['result'])"
    );
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(
        stdout(&body),
        "1 {'n': 1} | 2 cancelled the program stopped waiting for this call | 3 {'n': 3} | 4 {'n': 4}\n",
        "{body}"
    );
    assert_eq!(body["verdict"], "ok", "{body}");
    let metrics = s.get("/metrics").await.2;
    assert_eq!(
        counted(&metrics, "cancelled", "http", "hold"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"snakecage_workers_killed_total{reason="protocol_violation"}"#
        ),
        0.0,
        "{metrics}"
    );
}

/// Cancels written without end do not hold the run: it ends at its deadline (a timeout,
/// not a protocol violation), and the next run is served.
#[tokio::test]
async fn a_flood_of_cancels_still_ends_at_the_deadline() {
    let (s, _seen, _dir) = server("").await;
    let code = format!(
        "{RAW_FRAMES}
batch = frames({{'type': 'tool_cancel', 'id': i}} for i in range(1000))
print('flut', flush=True)
while True:
    os.write(3, batch)"
    );
    let client = s.client.clone();
    let url = format!("{}/v1/execute", s.base);
    let body: Value = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        client
            .post(url)
            .json(&json!({"code": code, "timeout_ms": 2000}))
            .send(),
    )
    .await
    .expect("the run must end at its deadline")
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(body["verdict"], "timeout", "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert_eq!(stdout(&body), "flut\n", "{body}");
    let next = s.run("print(6 * 7)").await;
    assert_eq!(stdout(&next), "42\n", "{next}");
}

/// A task awaiting `tools.aio` that is cancelled (explicitly, or by a `TaskGroup` one of
/// whose tasks failed) cancels its call: the host drops it (counted `cancelled`) and its
/// slot is free at once, not when the call would have been answered. The cap is 3: two
/// calls held, one slot to watch them with; then three calls must be in flight together
/// (`gate` waits for three at once), and after the group three calls need a slot each.
#[tokio::test]
async fn a_cancelled_await_frees_its_slot_at_once() {
    let (s, _seen, _dir) = server("max_concurrent_calls = 3").await;
    // `hold` answers after 20 s unless released, `gate` after 20 s without three at
    // once: the run's 15 s deadline would pass while the calls after the cancelled ones
    // waited for their slots.
    let code = "import asyncio
from snakecage import tools
async def held():
    while tools.status()['holding'] < 2:
        await asyncio.sleep(0.01)
async def main():
    tasks = [asyncio.create_task(tools.aio.hold(tag=i)) for i in range(2)]
    await held()
    for t in tasks:
        t.cancel()
    print([r.__class__.__name__ for r in await asyncio.gather(*tasks, return_exceptions=True)])
    met = await asyncio.gather(*(tools.aio.gate(city=i, together=3, wait_ms=20000) for i in range(3)))
    print([(m['city'], m['seen']) for m in met])
    async def stop():
        await held()
        raise ValueError('genug')
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(tools.aio.hold(tag='a'))
            group.create_task(tools.aio.hold(tag='b'))
            group.create_task(stop())
    except* ValueError as e:
        print('group stopped:', e.exceptions[0])
    print(await asyncio.gather(*(tools.aio.echo(n=i) for i in 'xyz')))
await main()";
    let body = s.run_with(json!({"code": code, "timeout_ms": 15000})).await;
    assert_eq!(
        stdout(&body),
        "['CancelledError', 'CancelledError']\n[(0, 3), (1, 3), (2, 3)]\n\
         group stopped: genug\n[{'n': 'x'}, {'n': 'y'}, {'n': 'z'}]\n",
        "{body}"
    );
    assert_eq!(body["verdict"], "ok", "{body}");
    let metrics = s.get("/metrics").await.2;
    assert_eq!(
        counted(&metrics, "cancelled", "http", "hold"),
        4.0,
        "{metrics}"
    );
}
