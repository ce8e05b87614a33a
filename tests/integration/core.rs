//! The core contract: Onyx-compatible `POST /v1/execute` on pre-forked workers.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{
    Options, Server, assert_peak_rss_grew_little, check_error_body, children_of, descendants_of,
    peak_rss, process_exists,
};
use crate::zygote_death::{MARKER, job_started};

#[tokio::test]
async fn programs_behave_as_under_python_main() {
    let s = Server::start().await;

    let r = s.run("print('hello world')").await;
    assert_eq!(r["stdout"], "hello world\n");
    assert_eq!(r["stderr"], "");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["verdict"], "ok");
    assert_eq!(r["files"], json!([]));
    assert_eq!(r["error"], json!(null));
    assert!(r["duration_ms"].is_u64());

    // Jupyter-style: a bare last expression is displayed, earlier ones are not.
    assert_eq!(s.run("1 + 1\n2 + 2").await["stdout"], "4\n");
    let r = s
        .run_with(json!({"code": "1 + 1\n2 + 2", "last_line_interactive": false}))
        .await;
    assert_eq!(r["stdout"], "");

    let r = s.run("def f():\n    return 1 / 0\nf()").await;
    assert_eq!(r["exit_code"], 1);
    assert_eq!(r["verdict"], "error");
    let err = r["stderr"].as_str().unwrap();
    assert!(
        err.starts_with("Traceback (most recent call last):\n"),
        "{err}"
    );
    assert!(err.contains("File \"__main__.py\", line 2, in f"), "{err}");
    assert!(
        err.trim_end()
            .ends_with("ZeroDivisionError: division by zero"),
        "{err}"
    );
    assert!(
        !err.contains("runner"),
        "runner frames leak into the traceback: {err}"
    );
    assert_eq!(
        r["error"],
        json!({"type": "ZeroDivisionError", "message": "division by zero"})
    );

    let r = s.run("import sys\nprint('bye')\nsys.exit(3)").await;
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(3), json!("bye\n"))
    );
    assert_eq!(r["verdict"], "error");
    assert_eq!(
        r["error"],
        json!(null),
        "SystemExit is an exit, not an error"
    );

    let r = s.run_with(json!({"code": "import sys\nprint(input().upper())\nprint(sys.stdin.read())", "stdin": "abc\nrest"})).await;
    assert_eq!(r["stdout"], "ABC\nrest\n");

    // fd-level writes (as C code makes them) are captured too, in order with print.
    let r = s
        .run("import os\nprint('a', flush=True)\nos.write(1, b'b\\n')\nos.write(2, b'e')\nNone")
        .await;
    assert_eq!(r["stdout"], "a\nb\n");
    assert_eq!(r["stderr"], "e");

    let r = s.run("import numpy as np, pandas as pd\nprint(int(np.arange(10).sum()), pd.DataFrame({'a': [1, 2]})['a'].sum())").await;
    assert_eq!(r["stdout"], "45 3\n");
}

/// An exception whose message is tens of megabytes used to make the result frame too
/// large to send, and the worker died with everything the run produced. The `error`
/// entry is cut; stdout, the (limited) traceback and the rich outputs still arrive.
#[tokio::test]
async fn an_exception_with_a_huge_message_still_reports_its_run() {
    let s = Server::start().await;
    // Tens of megabytes to build, encode and cut: seconds on a busy host, so the longest
    // deadline there is.
    let code = "print('before')\ndisplay('shown')\nraise ValueError('ü' * 35_000_000)";
    let r = s
        .run_with(json!({"code": code, "timeout_ms": 60_000}))
        .await;
    assert_eq!(r["verdict"], "output_limit", "{:.300}", r.to_string());
    assert_eq!(r["exit_code"], 1);
    assert_eq!(r["stdout"], "before\n'shown'\n");
    assert_eq!(r["results"], json!([{"text/plain": "'shown'"}]));
    assert_eq!(r["error"]["type"], "ValueError");
    let message = r["error"]["message"].as_str().unwrap();
    assert_eq!(message, format!("{}\n...[truncated]", "ü".repeat(8192)));
    assert_eq!(r["stderr_truncated"], true);
    // The same worker pool goes on serving.
    assert_eq!(s.run("print(2)").await["stdout"], "2\n");
}

/// The supervisor's end of a job socket waits for room only when the socket is full (it is
/// registered for readability alone): a job far larger than the socket buffer must still
/// arrive whole, in a one-shot run and in a session, with its stdin.
#[tokio::test]
async fn a_job_larger_than_the_socket_buffer_arrives_whole() {
    let s = Server::start().await;
    // 3 MiB of code (a literal of two-byte characters) and 2 MiB of stdin.
    let literal = "é".repeat(1_500_000);
    let code = format!(
        "import hashlib, sys\ns = '{literal}'\nt = sys.stdin.read()\n\
         print(len(s), len(t), hashlib.sha256((s + t).encode()).hexdigest())"
    );
    let stdin = "ß".repeat(1_000_000);
    let want = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("{literal}{stdin}").as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("1500000 1000000 {hex}\n")
    };
    // Compiling the literal and hashing it all takes seconds of CPU on a busy host: the
    // longest deadline there is, so that only a job that does not arrive fails.
    let job = json!({ "code": code, "stdin": stdin, "timeout_ms": 60_000 });
    let r = s.run_with(job.clone()).await;
    assert_eq!(
        (r["stdout"].as_str(), r["exit_code"].as_i64()),
        (Some(want.as_str()), Some(0)),
        "{}",
        r["stderr"]
    );

    let id = s.new_session().await;
    let (status, r) = s.post(&format!("/v1/sessions/{id}/execute"), &job).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"].as_str(), Some(want.as_str()), "{}", r["stderr"]);
    // The session's worker still answers after it.
    assert_eq!(
        s.session_run(&id, "print(len(s))").await["stdout"],
        "1500000\n"
    );
}

#[tokio::test]
async fn an_infinite_loop_is_killed_at_its_deadline_and_the_next_request_is_served() {
    // A default far from the requested 500 ms, so which deadline applied is plain without
    // timing the machine.
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_LIMITS__DEFAULT_TIMEOUT_MS", 30_000)
            .env("SNAKECAGE_LIMITS__MAX_TIMEOUT_MS", 60_000),
    )
    .await;
    let started = Instant::now();
    let r = s
        .run_with(
            json!({"code": "print('start', flush=True)\nwhile True: pass", "timeout_ms": 500}),
        )
        .await;
    let elapsed = started.elapsed();
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["exit_code"], json!(null));
    assert_eq!(r["verdict"], "timeout");
    assert_eq!(r["stdout"], "start\n", "output before the deadline is kept");
    // Not a timing benchmark: only that the deadline was the requested one, not the default.
    assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
    assert_eq!(s.run("print(2)").await["stdout"], "2\n");
}

#[tokio::test]
async fn a_huge_allocation_is_a_memory_limit_verdict_with_memory_error() {
    let s = Server::start().await;
    let r = s.run("bytearray(10**10)").await;
    assert_eq!(r["verdict"], "memory_limit");
    assert_eq!(r["exit_code"], 1);
    assert!(r["stderr"].as_str().unwrap().contains("MemoryError"), "{r}");
    // numpy's allocation error is a MemoryError too.
    let r = s
        .run("import numpy as np\nnp.ones((1 << 20, 1 << 10))")
        .await;
    assert_eq!(r["verdict"], "memory_limit", "{r}");
    // Source nested too deeply for CPython's parser raises MemoryError too, but that is
    // the source's fault, not the memory budget.
    let r = s.run(&format!("x = {}1", "-".repeat(100_000))).await;
    assert_eq!(r["verdict"], "error", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("Parser stack overflowed"),
        "{r}"
    );
    // Below the budget is fine.
    let r = s.run("b = bytearray(100 * 2**20)\nprint(len(b))").await;
    assert_eq!(
        (r["verdict"].clone(), r["stdout"].clone()),
        (json!("ok"), json!("104857600\n"))
    );
}

/// A worker's `RLIMIT_DATA` is its data size as it starts (the zygote's at the fork, read
/// by the zygote, and the allocator's reserve the worker maps) plus `limits.memory_limit_mb`,
/// read from `/proc` (which a worker may not read itself) on the idle workers of every
/// tier. On the bare tier, whose warm-up maps nothing, exactly; on the others the warm-up,
/// which runs after the limits apply, may have mapped a little more.
#[tokio::test]
async fn an_idle_workers_data_limit_is_its_data_size_and_its_memory_budget() {
    const BUDGET: i64 = 96 << 20;
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_LIMITS__MEMORY_LIMIT_MB", 96)).await;
    s.wait_for_every_tier().await;
    let health = s.health().await;
    let kib = |status: &str, key: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let mut checked = 0;
    for tier in health["pool"]["tiers"].as_array().unwrap() {
        let zygote = tier["zygote"]["pid"].as_u64().unwrap() as u32;
        for worker in children_of(zygote) {
            let (Ok(limits), Ok(status)) = (
                std::fs::read_to_string(format!("/proc/{worker}/limits")),
                std::fs::read_to_string(format!("/proc/{worker}/status")),
            ) else {
                continue; // it has just gone
            };
            let line = limits
                .lines()
                .find(|l| l.starts_with("Max data size"))
                .unwrap();
            let Ok(limit) = line.split_whitespace().nth(3).unwrap().parse::<u64>() else {
                continue; // "unlimited": a worker just forked, its limits not on yet
            };
            let data = kib(&status, "VmData:");
            let what = format!(
                "{} worker {worker}: limit {limit}, VmData {data}",
                tier["name"]
            );
            // Signed: a baseline set too low would leave less room than nothing.
            let room = limit as i64 - data as i64;
            if tier["name"] == "bare" {
                assert_eq!(room, BUDGET, "{what}");
                checked += 1;
            } else {
                assert!(room <= BUDGET, "{what}");
                assert!(room > BUDGET - (8 << 20), "{what}");
            }
        }
    }
    assert!(checked > 0, "no idle bare worker was read: {health}");
}

#[tokio::test]
async fn flooding_output_is_truncated_and_the_service_stays_small() {
    let s = Server::start().await;
    let base = peak_rss(s.pid());
    // 50 MB through the pipe: seconds on a busy host, so the longest deadline there is.
    let code = "import sys\nsys.stdout.write('y' * 50_000_000)\nprint('done', file=sys.stderr)";
    let r = s
        .run_with(json!({"code": code, "timeout_ms": 60_000}))
        .await;
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(r["stderr_truncated"], false);
    assert_eq!(r["verdict"], "output_limit");
    assert_eq!(r["exit_code"], 0);
    // Its first and last 500,000 bytes, and how many went between them.
    let mark = "\n...[49000000 bytes truncated]...\n";
    assert_eq!(
        out,
        format!("{}{mark}{}", "y".repeat(500_000), "y".repeat(500_000))
    );
    assert_eq!(r["stderr"], "done\n");
    // The supervisor never held the 50 MB: its peak RSS grew far less than that.
    assert_peak_rss_grew_little(s.pid(), base, "50 MB of output");
}

/// A progress bar drawn fast (200,000 redraws with `\r`, of three-byte characters) and
/// then the answer: the output is cut in its middle, so the answer, at its end, survives,
/// in a one-shot run and in a session (which goes on with its state). The head, the count
/// of bytes left out and the tail add up to what the program wrote, and neither cut splits
/// a character.
#[tokio::test]
async fn the_answer_printed_after_a_fast_progress_bar_survives_the_output_limit() {
    let s = Server::start_with(Options::default().env("SNAKECAGE_LIMITS__MAX_OUTPUT_BYTES", 4096))
        .await;
    let code = "import sys\nwritten = 0\nfor i in range(200_000):\n    \
                frame = '\\r%3d%% %s' % (i // 2000, '█' * (i % 7))\n    \
                sys.stdout.write(frame)\n    written += len(frame.encode())\n\
                answer = '\\nréponse = 42 ✓\\n'\nsys.stdout.write(answer)\n\
                print(written + len(answer.encode()), file=sys.stderr)";
    let session = s.new_session().await;
    // 200,000 writes are CPU-bound: the default 2 s deadline is not what this tests, and a
    // machine busy with the rest of the suite can take longer than that.
    let body = json!({ "code": code, "timeout_ms": 60_000 });
    let stateless = s.run_with(body.clone()).await;
    let (status, in_session) = s
        .post(&format!("/v1/sessions/{session}/execute"), &body)
        .await;
    assert_eq!(status, 200, "{in_session}");
    for r in [stateless, in_session] {
        assert_eq!(r["verdict"], "output_limit", "{r}");
        assert_eq!(r["stdout_truncated"], true);
        let out = r["stdout"].as_str().unwrap();
        assert!(out.ends_with("\r 99% ██\nréponse = 42 ✓\n"), "{out}");
        assert!(out.starts_with("\r  0% \r  0% █\r  0% ██"), "{out:.40}");
        assert!(
            !out.contains('\u{fffd}'),
            "a character was cut in half: {out}"
        );
        let (head, rest) = out.split_once("\n...[").unwrap();
        let (count, tail) = rest.split_once(" bytes truncated]...\n").unwrap();
        assert!(head.len() <= 2048 && tail.len() <= 2048, "{out}");
        let written: usize = r["stderr"].as_str().unwrap().trim().parse().unwrap();
        assert_eq!(
            head.len() + count.parse::<usize>().unwrap() + tail.len(),
            written
        );
    }
    assert_eq!(
        s.session_run(&session, "print(written > 0)").await["stdout"],
        "True\n"
    );
}

#[tokio::test]
async fn requests_never_see_each_others_globals_files_or_process() {
    let s = Server::start().await;
    let a = s.run("import os\nsecret = 42\nopen('mine.txt', 'w').write('a')\nimport json\njson.dumps = None\nprint(os.getpid())").await;
    assert_eq!(a["verdict"], "ok", "{a}");
    let b = s
        .run("import os, json\nprint('secret' in globals(), os.path.exists('mine.txt'), json.dumps is None, os.listdir('.'))\nprint(os.getpid())")
        .await;
    let lines: Vec<&str> = b["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines[0], "False False False []");
    assert_ne!(
        lines[1],
        a["stdout"].as_str().unwrap().trim(),
        "a worker was reused"
    );
}

#[tokio::test]
async fn two_hundred_concurrent_requests_are_all_answered_correctly() {
    // The last of the 200 waits for the 199 before it: on a slow machine, with the rest
    // of the suite running beside it, that came within 1 s of the default 30 s queue
    // timeout. What this asserts is that every one is answered, and correctly.
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 4)
            .env("SNAKECAGE_POOL__QUEUE_TIMEOUT_MS", 120_000),
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let client = s.client.clone();
        let url = format!("{}/v1/execute", s.base);
        tasks.push(tokio::spawn(async move {
            let body = json!({"code": format!("x = {i}\nx * 2"), "timeout_ms": 30000});
            let resp = client.post(url).json(&body).send().await.unwrap();
            let status = resp.status().as_u16();
            let v: serde_json::Value = resp.json().await.unwrap();
            (i, status, v)
        }));
    }
    for t in tasks {
        let (i, status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["stdout"], format!("{}\n", i * 2), "{v}");
    }
}

#[tokio::test]
async fn killing_the_zygote_mid_run_fails_that_run_and_the_service_recovers() {
    let s = Server::start().await;
    let health = s.health().await;
    // The zygote of the tier the job runs on: it imports nothing heavy, so the first.
    let zygote = health["pool"]["tiers"][0]["zygote"]["pid"]
        .as_u64()
        .unwrap() as i32;
    // It prints before it is killed, so it is not run again (`zygote_death` has the run
    // that is).
    let code = format!(
        "print('avant', flush=True)\nopen({MARKER:?}, 'w').close()\nimport time\ntime.sleep(5)"
    );
    let running = s.spawn_execute(json!({"code": code, "timeout_ms": 10000}));
    job_started(&s).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let r = running.await.unwrap();
    assert_eq!(r["verdict"], "killed", "{r}");
    assert_eq!(r["stdout"], "avant\n", "{r}");
    assert_eq!(r["exit_code"], json!(null));

    // Queued and later requests are served (by a fuller tier until the zygote is back).
    let r = s.run("print('after')").await;
    assert_eq!(r["stdout"], "after\n", "{r}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let health = loop {
        let health = s.health().await;
        if health["pool"]["zygote_restarts"] == 1 && health["pool"]["zygote"]["alive"] == true {
            break health;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not restarted: {health}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_ne!(
        health["pool"]["tiers"][0]["zygote"]["pid"]
            .as_u64()
            .unwrap() as i32,
        zygote
    );
    // The tier's zygote says it was restarted once, as `restarts` (not a `generation`,
    // which is the zygote generation's id, `generation.id`, and did not change).
    let restarted = &health["pool"]["tiers"][0]["zygote"];
    assert_eq!(restarted["restarts"], 1, "{health}");
    assert!(restarted.get("generation").is_none(), "{health}");
    assert_eq!(health["generation"]["id"], 1, "{health}");
    assert!(!process_exists(zygote as u32));
    let r = s.run("print('restarted')").await;
    assert_eq!(r["stdout"], "restarted\n", "{r}");
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 1)
            .env("SNAKECAGE_POOL__QUEUE_LENGTH", 1),
    )
    .await;
    let sleeper = json!({"code": "import time\ntime.sleep(1.5)", "timeout_ms": 5000});
    let mut tasks = Vec::new();
    for i in 0..4 {
        let client = s.client.clone();
        let url = format!("{}/v1/execute", s.base);
        let body = sleeper.clone();
        tasks.push(tokio::spawn(async move {
            let resp = client.post(url).json(&body).send().await.unwrap();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            (
                resp.status().as_u16(),
                retry_after,
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        }));
        // The first takes the one worker, the second the one place in the queue; the
        // others find it full.
        match i {
            0 => {
                s.wait_for_pool("the first running", |p| p["busy"] == 1)
                    .await
            }
            1 => {
                s.wait_for_pool("the second queued", |p| p["queue_depth"] == 1)
                    .await
            }
            _ => {}
        }
    }
    let mut statuses = Vec::new();
    for t in tasks {
        let (status, retry_after, body) = t.await.unwrap();
        if status == 429 {
            assert_eq!(retry_after.as_deref(), Some("1"));
            assert!(
                body["detail"].as_str().unwrap().contains("queue is full"),
                "{body}"
            );
        } else {
            assert_eq!(status, 200, "{body}");
        }
        statuses.push(status);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(statuses.contains(&200), "{statuses:?}");
}

#[tokio::test]
async fn malformed_requests_get_4xx_with_a_detail() {
    let s = Server::start_with(Options::default().env("SNAKECAGE_LIMITS__MAX_REQUEST_BYTES", 4096))
        .await;
    let url = format!("{}/v1/execute", s.base);
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (
            s.client
                .post(&url)
                .header("content-type", "application/json")
                .body("{\"code\": "),
            400,
            "not valid JSON",
        ),
        (
            s.client.post(&url).json(&json!({"cod": "print(1)"})),
            422,
            "unknown field `cod`, expected one of `code`",
        ),
        (
            s.client.post(&url).json(&json!({"stdin": "x"})),
            422,
            "missing field `code`",
        ),
        (
            s.client.post(&url).json(&json!({"code": 5})),
            422,
            "invalid type",
        ),
        (
            s.client
                .post(&url)
                .json(&json!({"code": "1", "timeout_ms": "soon"})),
            422,
            "timeout_ms",
        ),
        (
            s.client
                .post(&url)
                .json(&json!({"code": "1", "timeout_ms": 60001})),
            422,
            "timeout_ms exceeds maximum of 60000 ms",
        ),
        (
            s.client
                .post(&url)
                .json(&json!({"code": "1", "timeout_ms": 0})),
            422,
            "timeout_ms must be greater than 0",
        ),
        (
            s.client.post(&url).body("print(1)"),
            415,
            "Content-Type: application/json",
        ),
        (
            s.client
                .post(&url)
                .json(&json!({"code": "x".repeat(10_000)})),
            413,
            "over 4096 bytes (limits.max_request_bytes)",
        ),
        (
            s.client.get(format!("{}/v1/nope", s.base)),
            404,
            "no route for /v1/nope",
        ),
    ];
    let codes = [
        "bad_request",
        "invalid_request",
        "invalid_request",
        "invalid_request",
        "invalid_request",
        "timeout_too_large",
        "invalid_request",
        "unsupported_media_type",
        "payload_too_large",
        "not_found",
    ];
    assert_eq!(codes.len(), cases.len());
    for ((req, status, needle), code) in cases.into_iter().zip(codes) {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status);
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(check_error_body(status, &body), code, "{body}");
        let detail = body["detail"]
            .as_str()
            .unwrap_or_else(|| panic!("no detail in {body}"));
        assert!(
            detail.contains(needle),
            "{detail:?} does not mention {needle:?}"
        );
    }
    // The service is unharmed.
    assert_eq!(s.run("print(1)").await["stdout"], "1\n");
}

#[tokio::test]
async fn shutdown_kills_and_reaps_every_worker_and_the_zygote() {
    let s = Server::start().await;
    // The pool of two is full: a zygote and two workers.
    s.wait_for_idle(2).await;
    let below = descendants_of(s.pid());
    assert!(
        below.len() >= 3,
        "expected a zygote and workers, found {below:?}"
    );
    s.stop_leaving_no_process(below);
}

#[tokio::test]
async fn health_reports_the_pool_and_the_interpreter() {
    let s = Server::start().await;
    let h = s.health().await;
    assert_eq!(h["status"], "ok");
    assert_eq!(h["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(h["python_version"], "3.12.1");
    assert_eq!(h["pool"]["target_size"], 2);
    let names: Vec<&str> = h["preloaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"numpy") && names.contains(&"pandas"),
        "{names:?}"
    );
}

#[tokio::test]
async fn workspaces_left_by_a_killed_supervisor_are_removed_at_the_next_start() {
    let ws = tempfile::tempdir().unwrap();
    let opts = || Options::default().env("SNAKECAGE_WORKSPACE__DIR", ws.path().display());
    let first = Server::start_with(opts()).await;
    let left = ws.path().join(format!("workspaces-{}", first.pid()));
    assert!(left.is_dir());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = first.stop();
    assert!(
        left.is_dir(),
        "a SIGKILLed supervisor cannot clean up after itself"
    );
    let second = Server::start_with(opts()).await;
    assert!(
        !left.exists(),
        "the abandoned workspace root is still there"
    );
    assert!(
        ws.path()
            .join(format!("workspaces-{}", second.pid()))
            .is_dir()
    );
}

#[tokio::test]
async fn workspaces_live_on_dev_shm_by_default_when_it_is_a_large_tmpfs() {
    let shm = nix::sys::statvfs::statvfs("/dev/shm");
    let big_tmpfs = nix::sys::statfs::statfs("/dev/shm")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        && shm.is_ok_and(|st| st.blocks() * st.fragment_size() >= 1 << 30);
    let s = Server::start_with(Options::default().default_workspace_dir()).await;
    let root = std::path::Path::new("/dev/shm/snakecage").join(format!("workspaces-{}", s.pid()));
    let r = s.run("import os\nprint(os.getcwd())").await;
    let cwd = r["stdout"].as_str().unwrap().trim().to_owned();
    if big_tmpfs {
        assert!(root.is_dir(), "{} missing", root.display());
        assert!(
            cwd.starts_with(&root.display().to_string()),
            "{cwd} is not under {}",
            root.display()
        );
    } else {
        assert!(!root.exists());
    }
    drop(s);
    assert!(!root.exists(), "workspaces are removed at shutdown");
}

/// Forks and everything before Ready run at background priority (`SCHED_IDLE` when the
/// service holds CAP_SYS_NICE, else nice 10; children inherit it from the zygote), so
/// refilling never takes the CPU from a request in flight; a worker given a job is raised
/// to `SCHED_OTHER`, nice 0 (only a supervisor with CAP_SYS_NICE can raise it).
#[tokio::test]
async fn idle_workers_wait_at_background_priority_and_a_job_runs_at_normal_priority() {
    let s = Server::start().await;
    s.wait_for_idle(2).await;
    // (policy, nice) of a live process: fields 41 and 19 of /proc/PID/stat; None once it
    // is gone or a zombie.
    let priority = |pid: u32| -> Option<(i64, i64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        if ["Z", "X"].contains(&fields[0]) {
            return None;
        }
        Some((
            fields[41 - 3].parse().unwrap(),
            fields[19 - 3].parse().unwrap(),
        ))
    };
    let capable = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap() & (1 << 23) != 0)
        .unwrap();
    let background = if capable {
        (libc::SCHED_IDLE as i64, 0)
    } else {
        (libc::SCHED_OTHER as i64, 10)
    };
    let below = descendants_of(s.pid());
    assert!(below.len() >= 3, "{below:?}");
    for pid in below {
        // A worker the pool lets go (a cold one retired once a warmed one is idle) is put
        // at SCHED_IDLE, nice 19, and killed; on a busy host it may take a while to die.
        // A process still starting (a zygote preloading) reaches background priority
        // once ready. Either way it must not stay alive at any other priority.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match priority(pid) {
                None => break, // gone: it was on its way out
                Some(p) if p == background => break,
                Some(p) => assert!(
                    Instant::now() < deadline,
                    "zygote or idle worker {pid} stays at {p:?}, not {background:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let r = s
        .run("import os\nprint(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))")
        .await;
    let expected = if capable { "0 0\n" } else { "0 10\n" };
    assert_eq!(r["stdout"], expected, "{r}");
}

/// The zygote is started with every symbol bound at once (so workers do not each resolve
/// them after fork), and its workers see none of that: their environment is the fixed one.
#[tokio::test]
async fn zygotes_bind_symbols_at_start_and_workers_see_only_the_fixed_environment() {
    let s = Server::start().await;
    let health = s.health().await;
    for tier in health["pool"]["tiers"].as_array().unwrap() {
        let pid = tier["zygote"]["pid"].as_u64().unwrap();
        // The environment the zygote was executed with (what the dynamic loader read).
        let initial = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(
            initial.split(|&b| b == 0).any(|v| v == b"LD_BIND_NOW=1"),
            "tier {}: {}",
            tier["name"],
            String::from_utf8_lossy(&initial)
        );
    }
    let r = s
        .run("import os\nprint(sorted(k for k in os.environ if k.startswith('LD_')))")
        .await;
    assert_eq!(r["stdout"], "[]\n", "{r}");
}
