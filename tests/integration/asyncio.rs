//! asyncio in the sandbox, as a user's program meets it: `asyncio.run`, top-level `await`
//! (stateless and in sessions), what a job leaves running, interrupts and deadlines, on a
//! tier that preloads asyncio and on one that imports it when a job asks. What asyncio
//! could reach beyond the process (sockets, subprocesses) is in the hostile suite
//! (`escapes::network`, `escapes::process`).

use serde_json::{Value, json};

use crate::escapes::ALL_LAYERS;
use crate::harness::{Options, Server};

fn stdout(r: &Value) -> &str {
    r["stdout"].as_str().unwrap_or_default()
}

/// What every tier must do with asyncio, checked on `s`.
async fn asyncio_works(s: &Server) {
    // asyncio.run, gather, a thread waking the loop (the loop's self-pipe), to_thread.
    let r = s
        .run(
            "import asyncio, threading\n\
             async def twice(word):\n    await asyncio.sleep(0.01)\n    return word * 2\n\
             async def main():\n\
             \x20   loop = asyncio.get_running_loop()\n\
             \x20   woken = loop.create_future()\n\
             \x20   threading.Thread(target=loop.call_soon_threadsafe, args=(woken.set_result, 'fil')).start()\n\
             \x20   words = await asyncio.gather(twice('né'), twice('日本'))\n\
             \x20   return words, await woken, await asyncio.to_thread(len, 'ünï')\n\
             print(asyncio.run(main()))",
        )
        .await;
    assert_eq!(stdout(&r), "(['néné', '日本日本'], 'fil', 3)\n", "{r}");
    assert_eq!(r["verdict"], "ok", "{r}");

    // Top-level await, its last expression displayed like a notebook cell's.
    let r = s
        .run_with(json!({
            "code": "import asyncio\nawait asyncio.sleep(0)\nprint('après')\nawait asyncio.sleep(0, {'clé': 'valeur'})",
            "last_line_interactive": true,
        }))
        .await;
    assert_eq!(stdout(&r), "après\n{'clé': 'valeur'}\n", "{r}");
    assert_eq!(
        r["results"],
        json!([{"text/plain": "{'clé': 'valeur'}"}]),
        "{r}"
    );

    // A last expression that awaits, after a body that does not.
    let r = s
        .run_with(json!({
            "code": "import asyncio\nx = 20\nawait asyncio.sleep(0, x + 22)",
            "last_line_interactive": true,
        }))
        .await;
    assert_eq!(r["results"], json!([{"text/plain": "42"}]), "{r}");

    // An exception from awaited code: the traceback shows the job's frames only.
    let r = s
        .run("import asyncio\nasync def f():\n    raise ValueError('échec ✗')\nawait f()")
        .await;
    assert_eq!(r["exit_code"], 1, "{r}");
    assert_eq!(
        r["stderr"],
        "Traceback (most recent call last):\n  File \"__main__.py\", line 4, in <module>\n    await f()\n  File \"__main__.py\", line 3, in f\n    raise ValueError('échec ✗')\nValueError: échec ✗\n",
        "{r}"
    );

    // What the job left running is cancelled when it ends, as asyncio.run does: its
    // cleanup runs, and the run does not wait for its hour-long sleep.
    let r = s
        .run(
            "import asyncio\n\
             async def background():\n\
             \x20   try:\n        await asyncio.sleep(3600)\n\
             \x20   finally:\n        print('nettoyé')\n\
             task = asyncio.ensure_future(background())\n\
             await asyncio.sleep(0)\n\
             print('fin')",
        )
        .await;
    assert_eq!(stdout(&r), "fin\nnettoyé\n", "{r}");
    assert_eq!(r["verdict"], "ok", "{r}");

    // The pre-3.10 idiom: get_event_loop() outside a loop makes one (with a deprecation
    // warning), whatever loop the worker's warm-up ran before the job.
    let r = s
        .run("import asyncio\nloop = asyncio.get_event_loop()\nprint(loop.run_until_complete(asyncio.sleep(0, 'ok')))")
        .await;
    assert_eq!(stdout(&r), "ok\n", "{r}");
    assert_eq!(r["verdict"], "ok", "{r}");

    // A sync job may still call asyncio.run: no loop runs around it.
    let r = s
        .run("import asyncio\nprint(asyncio.run(asyncio.sleep(0, 'sync')))")
        .await;
    assert_eq!(stdout(&r), "sync\n", "{r}");

    // The deadline ends an await that never returns.
    let r = s
        .run_with(json!({"code": "import asyncio\nprint('avant', flush=True)\nawait asyncio.sleep(3600)", "timeout_ms": 1000}))
        .await;
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(stdout(&r), "avant\n", "{r}");
}

#[tokio::test]
async fn asyncio_and_top_level_await_work_in_a_hardened_worker() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)).await;
    asyncio_works(&s).await;
    // Async code runs on a tier that preloads asyncio: it is in the worker before the job.
    let r = s
        .run("import sys\nprint('asyncio' in sys.modules)\nawait __import__('asyncio').sleep(0)")
        .await;
    assert_eq!(stdout(&r), "True\n", "{r}");
}

/// A tier that does not preload asyncio imports it when a job asks: the self-pipe is
/// patched in as asyncio's module loads, in the worker.
#[tokio::test]
async fn asyncio_works_on_a_tier_that_imports_it_on_demand() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)
            .env(
                "SNAKECAGE_TIERS__PROFILE",
                r#"[{name = "bare", preload = []}]"#,
            ),
    )
    .await;
    let r = s.run("import sys\nprint('asyncio' in sys.modules)").await;
    assert_eq!(stdout(&r), "False\n", "{r}");
    asyncio_works(&s).await;
}

/// A script given as an entrypoint is run as `python script.py` would: no top-level await.
#[tokio::test]
async fn an_entrypoint_script_may_not_await_at_top_level() {
    let s = Server::start().await;
    let (status, file) = crate::files::try_upload(
        &s,
        "main.py",
        b"import asyncio\nawait asyncio.sleep(0)\n".to_vec(),
    )
    .await;
    assert_eq!(status, 201, "{file}");
    let r = s
        .run_with(json!({
            "entrypoint": "main.py",
            "files": [{"path": "main.py", "file_id": file["file_id"]}],
        }))
        .await;
    assert_eq!(r["exit_code"], 1, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .ends_with("SyntaxError: 'await' outside function\n"),
        "{r}"
    );
}

async fn session_run_with(s: &Server, id: &str, body: Value) -> Value {
    let (status, r) = s.post(&format!("/v1/sessions/{id}/execute"), &body).await;
    assert_eq!(status, 200, "{r}");
    r
}

#[tokio::test]
async fn a_session_keeps_its_event_loop_and_survives_an_interrupted_await() {
    let s = Server::start().await;
    let id = s.new_session().await;
    // A task started in one run goes on in the next run that awaits.
    let r = s
        .session_run(
            &id,
            "import asyncio\n\
             ticks = 0\n\
             async def tick():\n    global ticks\n    try:\n        while True:\n            await asyncio.sleep(0.005)\n            ticks += 1\n    finally:\n        open('arrêté.txt', 'w').write('oui')\n        print('arrêté')\n\
             ticker = asyncio.create_task(tick())\n\
             queue = asyncio.Queue()\n\
             await asyncio.sleep(0.05)\n\
             print(ticks > 0)",
        )
        .await;
    assert_eq!(stdout(&r), "True\n", "{r}");
    let r = s
        .session_run(
            &id,
            "before = ticks\nawait asyncio.sleep(0.05)\nprint(ticks > before, ticker.done())",
        )
        .await;
    assert_eq!(stdout(&r), "True False\n", "{r}");
    // A loop-bound object made in one run works in the next.
    let r = s
        .session_run(&id, "queue.put_nowait('élément')\nprint(await queue.get())")
        .await;
    assert_eq!(stdout(&r), "élément\n", "{r}");

    // The deadline interrupts an await: cleanup runs, the traceback points at the await,
    // the state and the loop are kept.
    let r = session_run_with(
        &s,
        &id,
        json!({"code": "try:\n    await asyncio.sleep(3600)\nfinally:\n    print('nettoyé')", "timeout_ms": 500}),
    )
    .await;
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(stdout(&r), "nettoyé\n", "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with(
            "Traceback (most recent call last):\n  File \"__main__.py\", line 2, in <module>\n    await asyncio.sleep(3600)\n"
        ),
        "{r}"
    );
    assert!(stderr.ends_with("\nKeyboardInterrupt\n"), "{r}");
    assert!(!stderr.contains("CancelledError"), "{r}");
    let r = s
        .session_run(
            &id,
            "await asyncio.sleep(0)\nprint(ticks > before, ticker.done())",
        )
        .await;
    assert_eq!(stdout(&r), "True False\n", "{r}");

    // A run that a task's SystemExit ends is over: the rest of it never runs later.
    let r = s
        .session_run(
            &id,
            "import sys\nasync def stop():\n    sys.exit(3)\nasyncio.create_task(stop())\nawait asyncio.sleep(0.2)\nprint('reste du premier')\nflag = 1",
        )
        .await;
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(stdout(&r), "", "{r}");
    let r = s
        .session_run(&id, "await asyncio.sleep(0.3)\nprint('flag' in globals())")
        .await;
    assert_eq!(stdout(&r), "False\n", "{r}");

    // A reset cancels the tasks of the state it drops (the ticker's `finally` writes its
    // file, and what it prints goes nowhere); the next run starts afresh.
    let r = s
        .session_run(&id, "import os\nprint(os.path.exists('arrêté.txt'))")
        .await;
    assert_eq!(stdout(&r), "False\n", "{r}");
    let (status, r) = s
        .post(&format!("/v1/sessions/{id}/reset"), &json!({}))
        .await;
    assert_eq!(status, 200, "{r}");
    let r = s
        .session_run(
            &id,
            "import asyncio\nprint(open('arrêté.txt').read(), 'ticker' in globals())\nawait asyncio.sleep(0, 'prêt')",
        )
        .await;
    assert_eq!(stdout(&r), "oui False\n'prêt'\n", "{r}");
}
