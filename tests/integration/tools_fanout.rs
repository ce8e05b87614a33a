//! Wide asyncio fan-outs: each call in flight of `tools.aio` has a thread of the worker,
//! with a small stack of its own, so the highest cap the configuration allows fits in the
//! run's memory; a thread that cannot start (the memory is used up) is a `ToolLimitError`
//! raised before anything is sent for that call.

use std::sync::atomic::Ordering;

use serde_json::json;

use crate::tools_cancel::sample;
use crate::tools_concurrent::{server, stdout};

/// 64 calls (the highest `tools.max_concurrent_calls`) gathered at once are all in flight
/// together under the default memory limit; with CPython's 8 MiB thread stacks about 30
/// fitted, and the rest failed with `RuntimeError: can't start new thread`.
#[tokio::test]
async fn sixty_four_calls_gathered_at_once_are_all_in_flight_together() {
    let (s, seen, _dir) = server("max_concurrent_calls = 64").await;
    let code = "import asyncio
from snakecage import tools
answers = await asyncio.gather(*(tools.aio.gate(city=i, together=64) for i in range(64)))
print([a['city'] for a in answers] == list(range(64)), min(a['seen'] for a in answers))
# The deepest answer a tool may give (64 levels: the echo of an argument 63 deep) is read
# on those small stacks too.
deep = 0
for _ in range(63):
    deep = [deep]
print(await tools.aio.echo(v=deep) == {'v': deep})";
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(stdout(&body), "True 64\nTrue\n", "{body}");
    assert_eq!(body["verdict"], "ok", "{body}");
    assert_eq!(seen.most_gating.load(Ordering::SeqCst), 64);
}

/// A run whose memory is used up cannot start a thread for its call: the call raises
/// `ToolLimitError` and never reaches the tool (before, it was queued anyway and went out
/// with the next call that found a thread), and once memory is free the next call works.
#[tokio::test]
async fn a_call_no_thread_can_be_started_for_raises_a_limit_error_and_is_never_sent() {
    let (s, _seen, _dir) = server("").await;
    let code = "import asyncio
from snakecage import tools
hog = []
for size in (1 << 20, 1 << 16):
    try:
        while True:
            hog.append(bytearray(size))
    except MemoryError:
        pass
del hog[-4:]
try:
    await tools.aio.echo(n='erst')
    print('sent')
except tools.ToolLimitError as e:
    outcome = (e.kind, e.tool, 'no thread could be started' in e.message)
del hog
print(outcome)
print(await tools.aio.echo(n='dann'))";
    let body = s.run_with(json!({"code": code, "timeout_ms": 60000})).await;
    assert_eq!(
        stdout(&body),
        "('limit', 'echo', True)\n{'n': 'dann'}\n",
        "{body}"
    );
    let metrics = s.get("/metrics").await.2;
    assert_eq!(
        sample(
            &metrics,
            r#"snakecage_tool_calls_total{outcome="ok",provider="http",tool="echo"}"#
        ),
        1.0,
        "{metrics}"
    );
}

/// A session whose memory is used up but for a few pages fans out 64 calls (the report:
/// the worker aborted, "memory allocation of 632 bytes failed", SIGABRT, the session
/// lost). The Rust half of a call no longer aborts: each call raises `MemoryError` or
/// `ToolLimitError` (no thread for it) or gets its answer, for each amount freed that
/// aborted before; and once the memory is free, the same session makes calls again.
#[tokio::test]
async fn a_fan_out_with_the_memory_used_up_raises_memory_error_and_the_session_lives() {
    let (s, _seen, _dir) = server("max_concurrent_calls = 64").await;
    let id = s.new_session().await;
    let fill = "import asyncio
from snakecage import tools
def outcomes(answers):
    return sorted({type(a).__name__ for a in answers})
hog = []
for size in (1 << 20, 1 << 16, 1 << 12):
    try:
        while True:
            hog.append(bytearray(size))
    except MemoryError:
        pass
";
    for pages in [1, 4, 8] {
        let code = format!(
            "{fill}del hog[-{pages}:]
answers = await asyncio.gather(*(tools.aio.echo(i=i) for i in range(64)), return_exceptions=True)
del hog
print(len(answers), set(outcomes(answers)) <= {{'dict', 'MemoryError', 'ToolLimitError'}}, outcomes(answers))"
        );
        let body = s.session_run(&id, &code).await;
        assert_eq!(body["verdict"], "ok", "freed {pages} pages: {body}");
        assert!(
            stdout(&body).starts_with("64 True "),
            "freed {pages} pages: {body}"
        );
    }
    // The session lives, and so do its calls. (A new thread of the pool may still find no
    // room: memory freed into the allocator's free lists, not given back to the kernel,
    // counts against the limit; that call raises `ToolLimitError`, as it did before.)
    let body = s
        .session_run(
            &id,
            "print(tools.echo(i='sync'))
try:
    print((await tools.aio.echo(i='aio'))['i'])
except tools.ToolLimitError:
    print('aio')",
        )
        .await;
    assert_eq!(stdout(&body), "{'i': 'sync'}\naio\n", "{body}");
}
