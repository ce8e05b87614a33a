//! What an operator sees: `/metrics` (checked by `promtool`), `/health` and `/ready`,
//! request ids in headers and logs, the live status page (driven in headless Chromium).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use snakecage::metrics::names;

use crate::harness::{Options, Server, repo_root};
use crate::prom::promtool_check;

const EXECUTIONS: &str = names::EXECUTIONS_TOTAL;

/// The sandbox layers active on a host like this one (all of them), as the build-info
/// label lists them.
const ALL_LAYERS: &str = "audit_hook,cgroup,drop_privileges,import_guard,landlock,mount_namespace,network_namespace,no_new_privs,rlimits,seccomp";

fn stateless(outcome: &str) -> [(&'static str, &str); 2] {
    [("kind", "stateless"), ("outcome", outcome)]
}

#[tokio::test]
async fn metrics_pass_promtool_and_count_what_was_served() {
    let s = Server::start().await;
    let before = s.scrape().await;
    promtool_check(&before.text);
    assert_eq!(before.get(names::POOL_TARGET_SIZE, &[]), 2.0);
    assert_eq!(before.get(EXECUTIONS, &stateless("ok")), 0.0);
    assert_eq!(before.get(EXECUTIONS, &stateless("rejected")), 0.0);
    assert_eq!(before.get(names::SESSIONS_ACTIVE, &[]), 0.0);
    let build = before.series(names::BUILD_INFO);
    assert_eq!(build.len(), 1, "{build:?}");
    assert_eq!(build[0].0["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(build[0].0["python_version"], "3.12.1");
    // Every layer the zygote's probe found active on this host, by name.
    assert_eq!(build[0].0["sandbox_layers"], ALL_LAYERS);
    assert_eq!(build[0].1, 1.0);

    for _ in 0..3 {
        assert_eq!(s.run("print(1)").await["verdict"], "ok");
    }
    for _ in 0..2 {
        assert_eq!(s.run("1 / 0").await["verdict"], "error");
    }
    let r = s
        .run_with(json!({"code": "while True: pass", "timeout_ms": 300}))
        .await;
    assert_eq!(r["verdict"], "timeout");
    // Refused before it could run: an HTTP 422, not an execution.
    let (status, _) = s.post("/v1/execute", &json!({"stdin": "no code"})).await;
    assert_eq!(status, 422);
    let (status, _, _) = s.get("/v1/files/does-not-exist").await;
    assert_eq!(status, 404);

    let after = s.scrape().await;
    promtool_check(&after.text);
    let delta = |name: &str, labels: &[(&str, &str)]| {
        after.get_or_zero(name, labels) - before.get_or_zero(name, labels)
    };
    assert_eq!(delta(EXECUTIONS, &stateless("ok")), 3.0);
    assert_eq!(delta(EXECUTIONS, &stateless("error")), 2.0);
    assert_eq!(delta(EXECUTIONS, &stateless("timeout")), 1.0);
    assert_eq!(after.sum(EXECUTIONS, &[]), 6.0, "no other outcome moved");
    let duration_count = format!("{}_count", names::EXECUTION_DURATION_SECONDS);
    assert_eq!(delta(&duration_count, &[("kind", "stateless")]), 6.0);
    // The timeout took 300 ms or more (how much more depends on the machine's load); the
    // histogram's buckets show it above 250 ms.
    let bucket = format!("{}_bucket", names::EXECUTION_DURATION_SECONDS);
    let under_quarter_second = after.get(&bucket, &[("kind", "stateless"), ("le", "0.25")]);
    let all = after.get(&bucket, &[("kind", "stateless"), ("le", "+Inf")]);
    assert!(
        all - under_quarter_second >= 1.0,
        "{all} {under_quarter_second}"
    );
    assert_eq!(
        delta(&format!("{}_count", names::QUEUE_WAIT_SECONDS), &[]),
        6.0
    );
    assert_eq!(
        delta(names::WORKERS_KILLED_TOTAL, &[("reason", "timeout")]),
        1.0
    );
    assert!(
        after.get(
            &format!("{}_count", names::WORKER_SPAWN_DURATION_SECONDS),
            &[]
        ) >= 6.0,
        "six workers were used"
    );
    let http = |route: &str, status: &str| {
        after.get_or_zero(
            names::HTTP_REQUESTS_TOTAL,
            &[("route", route), ("status", status)],
        )
    };
    assert_eq!(http("/v1/execute", "200"), 6.0);
    assert_eq!(http("/v1/execute", "422"), 1.0);
    assert_eq!(http("/v1/files/{file_id}", "404"), 1.0);
    assert_eq!(http("/metrics", "200"), 1.0, "the first scrape");
    assert_eq!(after.get(names::ZYGOTE_RESTARTS_TOTAL, &[]), 0.0);
    assert!(after.get(names::PROCESS_RESIDENT_MEMORY_BYTES, &[]) > 1e6);

    // Files stored: a count and what they are charged, read from the store (1000 bytes in
    // a 4 KiB block, and a block for the metadata).
    let upload = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(vec![b'x'; 1000]).file_name("x.txt"),
    );
    let resp = s
        .client
        .post(format!("{}/v1/files", s.base))
        .multipart(upload)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let stored = s.scrape().await;
    assert_eq!(stored.get(names::FILES_STORED, &[]), 1.0);
    assert_eq!(stored.get(names::FILES_STORED_BYTES, &[]), 8192.0);
}

#[tokio::test]
async fn every_request_gets_an_id_and_its_log_lines_carry_it_but_never_code_or_output() {
    let s = Server::start().await;
    let secret = "marker-3c1f9-never-logged";

    // A client's own id is kept and echoed; without one, the service makes one.
    let resp = s
        .client
        .post(format!("{}/v1/execute", s.base))
        .header("x-request-id", "obs-exec-1")
        .json(&json!({"code": format!("print('{secret}')\nraise ValueError('{secret}')")}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "obs-exec-1");
    let body: Value = resp.json().await.unwrap();
    assert!(body["stdout"].as_str().unwrap().contains(secret));
    let (_, headers, _) = s.get("/health").await;
    let generated = headers["x-request-id"].to_str().unwrap();
    assert_eq!(generated.len(), 36, "a UUID: {generated}");
    // One that could pass for log fields of its own, or too long, is replaced by ours.
    for forged in [
        "abc method=DELETE path=/v1/admin/packages status=200".to_owned(),
        "x".repeat(6000),
        "ümlaut".to_owned(),
    ] {
        let resp = s
            .client
            .get(format!("{}/health", s.base))
            .header("x-request-id", forged.as_bytes())
            .send()
            .await
            .unwrap();
        let echoed = resp.headers()["x-request-id"].to_str().unwrap();
        assert_eq!(echoed.len(), 36, "a UUID, not {forged:.40}: {echoed}");
    }

    let upload = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(secret.as_bytes().to_vec()).file_name("s.txt"),
    );
    let resp = s
        .client
        .post(format!("{}/v1/files", s.base))
        .header("x-request-id", "obs-upload-1")
        .multipart(upload)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["x-request-id"], "obs-upload-1");

    // The log is written by another thread of ours; give it a moment (a busy machine may
    // take seconds).
    let deadline = Instant::now() + Duration::from_secs(60);
    let lines = loop {
        let log = s.log();
        let lines: Vec<Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let done = lines
            .iter()
            .filter(|l| l["span"]["request_id"] == "obs-upload-1")
            .count()
            >= 2;
        if done || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let of = |id: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["span"]["request_id"] == id)
            .collect()
    };
    // The handler's own line and the access line are both in the request's span.
    let upload_lines = of("obs-upload-1");
    let messages: Vec<&str> = upload_lines
        .iter()
        .map(|l| l["fields"]["message"].as_str().unwrap_or(""))
        .collect();
    assert!(messages.contains(&"file uploaded"), "{messages:?}");
    assert!(
        messages.contains(&"finished processing request"),
        "{messages:?}"
    );
    let exec_lines = of("obs-exec-1");
    assert!(!exec_lines.is_empty(), "{}", s.log());
    for line in &exec_lines {
        assert_eq!(line["span"]["path"], "/v1/execute", "{line}");
    }
    // Every line logged inside a request names its request.
    for line in &lines {
        if line["span"]["name"] == "request" {
            assert!(
                line["span"]["request_id"]
                    .as_str()
                    .is_some_and(|id| !id.is_empty()),
                "{line}"
            );
        }
    }
    let log = s.log();
    assert!(
        !log.contains(secret),
        "user code or output reached the log:\n{log}"
    );
}

#[tokio::test]
async fn health_and_ready_report_the_pool_and_ready_fails_only_while_no_zygote_serves() {
    let s = Server::start().await;
    let (status, _, body) = s.get("/ready").await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ready"}"#));
    let h = s.health().await;
    assert_eq!(h["status"], "ok");
    assert_eq!(h["ready"], true);
    let active: Vec<&str> = h["sandbox"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["state"] == "active")
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(active.len(), 10, "{h}");
    assert_eq!(h["pool"]["target_size"], 2);

    // One tier's zygote dies: the other tiers serve its jobs while it is restarted, so the
    // service stays ready throughout.
    let zygote = h["pool"]["zygote"]["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = s.get("/ready").await;
        assert_eq!(status, 200, "{body}");
        let h = s.health().await;
        if h["pool"]["zygote_restarts"] == 1 && h["pool"]["zygote"]["alive"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "not restarted: {h}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let m = s.scrape().await;
    assert_eq!(m.get(names::ZYGOTE_RESTARTS_TOTAL, &[]), 1.0);
    assert_eq!(s.run("print(2)").await["stdout"], "2\n");

    // With one tier, its zygote's death leaves nothing that serves: 503 until it is back.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    std::fs::write(
        &config,
        "[[tiers.profile]]\nname = \"seul\"\npreload = []\n",
    )
    .unwrap();
    let s = crate::rollover::start(&config, Options::default()).await;
    let zygote = s.health().await["pool"]["zygote"]["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut seen = Vec::new();
    loop {
        let (status, _, body) = s.get("/ready").await;
        if seen.last() != Some(&status) {
            seen.push(status);
            if status == 503 {
                let body: Value = serde_json::from_str(&body).unwrap();
                let detail = body["detail"].as_str().unwrap();
                assert!(
                    detail.contains("the zygote of tier \"seul\" is not running"),
                    "{body}"
                );
            }
        }
        if seen == [200, 503, 200] || (seen == [503, 200]) {
            break;
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "ready went {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(s.run("print(3)").await["stdout"], "3\n");
}

#[tokio::test]
async fn on_sigterm_ready_fails_while_requests_are_still_served_then_the_service_stops() {
    // A drain long enough for the checks below on a busy machine.
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_WORKER__SHUTDOWN_DRAIN_MS", 15000))
            .await;
    assert_eq!(s.get("/ready").await.0, 200);
    assert_eq!(s.scrape().await.get(names::READY, &[]), 1.0);
    let pid = nix::unistd::Pid::from_raw(s.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, body) = s.get("/ready").await;
        if status == 503 {
            assert!(body.contains("shutting down"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "/ready still {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Still serving while load balancers notice; the metric says it too.
    assert_eq!(s.health().await["ready"], false);
    assert_eq!(s.scrape().await.get(names::READY, &[]), 0.0);
    assert_eq!(s.run("print(3)").await["stdout"], "3\n");
    let status = s.stop();
    assert!(status.success(), "{status:?}");
}

/// Whether every tier has all the idle workers it wants, none starting, and no request is
/// running or waiting: a pool that holds still until something comes or dies.
fn stocked(pool: &Value) -> bool {
    pool["busy"] == 0
        && pool["queue_depth"] == 0
        && pool["tiers"].as_array().is_some_and(|tiers| {
            tiers
                .iter()
                .all(|t| t["spawning"] == 0 && t["idle"].as_u64() >= t["target_idle"].as_u64())
        })
}

/// What of `/health`'s pool changes when a worker starts, stops or is taken (its workspace
/// with it).
fn pool_state(health: &Value) -> Value {
    let pool = &health["pool"];
    json!([
        pool["idle"],
        pool["busy"],
        pool["spawning"],
        pool["queue_depth"],
        pool["workers_spawned"],
        pool["spawn_failures"],
        pool["zygote_restarts"],
        health["workspace"]["used_bytes"],
        health["workspace"]["inodes_used"]
    ])
}

/// Runs headless Chromium with `args` on `url` (bounded in time: a start on a busy machine
/// takes tens of seconds); its stdout.
pub fn chromium(args: &[&str], url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium (Debian package chromium; scripts/test installs it)");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium: {status:?}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 300 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

/// The `data-value` of the element with `id` in a DOM dump.
pub fn dom_value(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let tag = &dom[at..at + dom[at..].find('>').unwrap()];
    let start = tag
        .find("data-value=\"")
        .unwrap_or_else(|| panic!("#{id} has no data-value: {tag}"))
        + "data-value=\"".len();
    tag[start..start + tag[start..].find('"').unwrap()].to_owned()
}

fn dom_number(dom: &str, id: &str) -> f64 {
    let value = dom_value(dom, id);
    value
        .parse()
        .unwrap_or_else(|_| panic!("#{id} shows {value:?}, not a number"))
}

#[tokio::test]
async fn the_status_page_shows_the_numbers_the_metrics_have() {
    let s = Server::start().await;
    let (status, headers, page) = s.get("/").await;
    assert_eq!(status, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        !page.contains("http://") && !page.contains("https://") && !page.contains("src="),
        "the page must not load external assets"
    );

    for _ in 0..5 {
        s.run("print('ok')").await;
    }
    for _ in 0..2 {
        s.run("raise RuntimeError('x')").await;
    }
    s.run_with(json!({"code": "import time\ntime.sleep(5)", "timeout_ms": 200}))
        .await;

    // The page and the scrape are two reads, seconds apart (Chromium starts in between):
    // the pool's gauges agree only if no worker started or stopped meanwhile. After the
    // runs every tier refills, at background priority, which on a busy machine goes on
    // long after the pool has a couple of idle workers; so wait until every tier is
    // stocked, and take both again if the pool changed all the same.
    let url = format!("{}/", s.base);
    let mut attempts = 0;
    let (dom, m) = loop {
        s.wait_for_pool("every tier stocked and nothing running", stocked)
            .await;
        let before = pool_state(&s.health().await);
        let dom = chromium(&["--virtual-time-budget=5000", "--dump-dom"], &url);
        let m = s.scrape().await;
        let after = pool_state(&s.health().await);
        if before == after {
            break (dom, m);
        }
        attempts += 1;
        assert!(
            attempts < 5,
            "the pool never held still: {before} then {after}"
        );
    };

    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page never loaded its data:\n{dom}"
    );
    let total = m.sum(EXECUTIONS, &[]);
    assert_eq!(total, 8.0);
    assert_eq!(dom_number(&dom, "executions-total"), total);
    for outcome in [
        "ok",
        "error",
        "timeout",
        "memory_limit",
        "output_limit",
        "killed",
        "rejected",
    ] {
        assert_eq!(
            dom_number(&dom, &format!("outcome-{outcome}")),
            m.sum(EXECUTIONS, &[("outcome", outcome)]),
            "{outcome}"
        );
    }
    let ok = m.sum(EXECUTIONS, &[("outcome", "ok")]);
    assert!((dom_number(&dom, "success-rate") - ok / total).abs() < 1e-9);
    assert_eq!(
        dom_number(&dom, "pool-idle"),
        m.get(names::POOL_IDLE_WORKERS, &[])
    );
    assert_eq!(
        dom_number(&dom, "pool-busy"),
        m.get(names::POOL_BUSY_WORKERS, &[])
    );
    assert_eq!(
        dom_number(&dom, "pool-target"),
        m.get(names::POOL_TARGET_SIZE, &[])
    );
    assert_eq!(
        dom_number(&dom, "queue-depth"),
        m.get(names::POOL_QUEUE_DEPTH, &[])
    );
    assert_eq!(
        dom_number(&dom, "queue-capacity"),
        m.get(names::POOL_QUEUE_CAPACITY, &[])
    );
    assert_eq!(
        dom_number(&dom, "sessions-active"),
        m.get(names::SESSIONS_ACTIVE, &[])
    );
    assert_eq!(
        dom_number(&dom, "zygote-restarts"),
        m.get(names::ZYGOTE_RESTARTS_TOTAL, &[])
    );
    // The workspace file system: the five gauges, and that it has room. (The idle workers'
    // empty workspaces take inodes; on a tmpfs no bytes.)
    for (id, metric) in [
        ("ws-size-bytes", names::WORKSPACE_SIZE_BYTES),
        ("ws-used-bytes", names::WORKSPACE_USED_BYTES),
        ("ws-inodes", names::WORKSPACE_INODES),
        ("ws-used-inodes", names::WORKSPACE_USED_INODES),
    ] {
        assert_eq!(dom_number(&dom, id), m.get(metric, &[]), "{id}");
    }
    for id in ["ws-size-bytes", "ws-inodes", "ws-used-inodes"] {
        assert!(dom_number(&dom, id) > 0.0, "{id}");
    }
    let bounded = m.get(names::WORKSPACE_BOUNDED, &[]) == 1.0;
    assert_eq!(dom_value(&dom, "ws-bounded"), bounded.to_string());
    // A root on this host mounts its tmpfs; elsewhere the page says it is unbounded.
    assert_eq!(bounded, nix::unistd::geteuid().is_root());
    assert_eq!(dom_value(&dom, "ws-nearly-full"), "false");
    // The workers' memory: its bound (by default half the host's, where a memory cgroup
    // can be made, as it can for a root here) and the kills, as the gauges say; what they
    // use moves with every spawn. Without a bound the page says so.
    let limit = m.get(names::WORKERS_MEMORY_LIMIT_BYTES, &[]);
    assert_eq!(limit > 0.0, nix::unistd::geteuid().is_root());
    if limit > 0.0 {
        assert_eq!(dom_number(&dom, "wm-limit-bytes"), limit);
        assert_eq!(
            dom_number(&dom, "wm-oom-kills"),
            m.get(names::WORKERS_OOM_KILLS, &[])
        );
        assert!(dom_number(&dom, "wm-used-bytes") > 0.0);
    } else {
        assert_eq!(dom_value(&dom, "wm-limit-bytes"), "");
    }

    // p50 and p99 (over the recent runs) agree with the histogram: at least half of the
    // runs took no longer than the first bucket bound at or above the p50, and the p99
    // covers the 200 ms timeout.
    let p50_s = dom_number(&dom, "latency-p50") / 1000.0;
    let p99_s = dom_number(&dom, "latency-p99") / 1000.0;
    assert!(p50_s > 0.0 && p50_s <= p99_s, "{p50_s} {p99_s}");
    assert!(
        p99_s >= 0.2,
        "the timed-out run took 200 ms or more: {p99_s}"
    );
    let bucket = format!("{}_bucket", names::EXECUTION_DURATION_SECONDS);
    let count = m.get(
        &format!("{}_count", names::EXECUTION_DURATION_SECONDS),
        &[("kind", "stateless")],
    );
    let bound = snakecage::metrics::EXECUTION_BUCKETS
        .into_iter()
        .find(|&b| b >= p50_s)
        .unwrap();
    let le = format!("{bound}");
    let at_or_below = m.get(&bucket, &[("kind", "stateless"), ("le", le.as_str())]);
    assert!(
        at_or_below >= count / 2.0,
        "{at_or_below} of {count} ≤ {le}"
    );

    // What runs: the Python packages with versions, the sandbox layers, recent failures
    // (outcome and request id, never code or output).
    // The allowed packages with versions, as /v1/packages lists them (not just the preloads).
    for package in ["numpy 2.", "pandas 3.", "scipy 1.", "PIL 1", "openpyxl 3."] {
        assert!(dom.contains(package), "{package} missing from the page");
    }
    let layers = m.series(names::BUILD_INFO)[0].0["sandbox_layers"].clone();
    assert_eq!(layers, ALL_LAYERS);
    let layers_at = dom.find("id=\"sandbox-layers\"").unwrap();
    let shown = &dom[layers_at..dom[layers_at..].find("</div>").unwrap() + layers_at];
    for layer in ALL_LAYERS.split(',') {
        assert!(
            shown.contains(&format!(">{layer}</span>")),
            "{layer} not shown in {shown}"
        );
    }
    assert_eq!(dom.matches("<tr class=\"failure\">").count(), 3, "{dom}");
    assert!(!dom.contains("RuntimeError"), "no output on the page");

    let shot = repo_root().join("target").join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    // `target/` of the checkout is not there when CARGO_TARGET_DIR points elsewhere.
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    chromium(
        &[
            "--virtual-time-budget=5000",
            "--window-size=1280,900",
            &format!("--screenshot={}", shot.display()),
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{}",
        png.len()
    );
}

/// The opening tag and the text of the element with `id` in a DOM dump (its text up to
/// the first child element).
fn dom_element<'a>(dom: &'a str, id: &str) -> (&'a str, &'a str) {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let end = at + dom[at..].find('>').unwrap();
    let text = &dom[end + 1..];
    (&dom[at..end], &text[..text.find('<').unwrap_or(text.len())])
}

/// During a file store outage the status page says so in red, with the backend, the
/// store's error and the last recovery of its directory, as `/health` has them: an
/// operator looking at it no longer sees all green. (A local store whose directory was
/// removed, recreated, then replaced by a file: its recovery is on record and it cannot
/// be recreated again.)
#[tokio::test]
async fn the_status_page_shows_the_file_store_down_with_why_and_its_last_recovery() {
    let s = Server::start().await;
    let url = format!("{}/", s.base);
    let dir = s.state_dir().join("files");
    let dom = chromium(&["--virtual-time-budget=5000", "--dump-dom"], &url);
    assert!(dom.contains("data-loaded=\"true\""), "{dom}");
    let (tag, text) = dom_element(&dom, "file-store-state");
    assert!(tag.contains("class=\"ok\""), "{tag}");
    assert_eq!(text, "available");
    assert_eq!(dom_element(&dom, "file-store-recovery").1, "none");

    crate::files::upload(&s, "perdu.csv", b"a,b\n1,2\n".to_vec()).await;
    std::fs::remove_dir_all(&dir).unwrap();
    let (status, _, body) = s.get("/v1/files").await;
    assert_eq!(status, 200, "{body}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, "a file where the store's directory was").unwrap();
    crate::reliability::eventually(
        30,
        "the background check finds the store down",
        async || s.health().await["file_store"]["state"] == "unavailable",
    )
    .await;
    let health = s.health().await;
    let (_, status) = s.get_json("/v1/status").await;
    assert_eq!(status["file_store"], health["file_store"], "{status}");

    let dom = chromium(&["--virtual-time-budget=5000", "--dump-dom"], &url);
    let (tag, text) = dom_element(&dom, "file-store-state");
    assert!(
        tag.contains("class=\"bad\"") && tag.contains("data-value=\"unavailable\""),
        "{tag}"
    );
    assert_eq!(text, "unavailable");
    assert_eq!(dom_element(&dom, "file-store-backend").1, "local");
    let (_, detail) = dom_element(&dom, "file-store-detail");
    assert!(
        detail.starts_with("the file store is unavailable")
            && detail.contains(&dir.display().to_string())
            && detail.contains("Not a directory"),
        "{detail}"
    );
    let (tag, recovery) = dom_element(&dom, "file-store-recovery");
    assert!(tag.contains("class=\"warn\""), "{tag}");
    let recorded = &health["file_store"]["last_recovery"];
    assert!(
        recovery.contains(recorded["at"].as_str().unwrap())
            && recovery.contains("had been removed from outside the service")
            && recovery.contains("the 1 file(s) stored before are lost"),
        "{recovery}"
    );
}

/// `log.level` a bare word that is no level (`warning`): `tracing` would read it as a
/// target and log nothing else, errors included, so the service ran silent. Refused.
#[test]
fn a_log_level_that_is_no_level_stops_start_up_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", dir.path())
        .env("SNAKECAGE_LOG__LEVEL", "warning")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(r#"log.level "warning" is not a log filter"#) && stderr.contains("warn"),
        "{stderr}"
    );
}

/// A service whose stderr is a pipe nobody reads any more (the terminal or log shipper
/// that started it is gone) still serves and still stops on SIGTERM. Logging "shutting down" to it failed,
/// the failure was reported to the same stderr with `eprintln!`, which panics, and the
/// task that would have stopped the service died: it ran on, for good.
#[tokio::test]
async fn a_service_whose_log_reader_is_gone_still_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = crate::backing::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--venv"])
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", dir.path())
        .env("SNAKECAGE_WORKSPACE__DIR", dir.path().join("espaces"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{port}/ready");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !client
        .get(&ready)
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(child.stderr.take()); // the reader goes away
    // Requests are still served: each one's log lines failed the same way, and the
    // request's task died with them, its connection closed without an answer.
    for _ in 0..3 {
        let r: Value = client
            .post(format!("http://127.0.0.1:{port}/v1/execute"))
            .json(&json!({"code": "print('toujours là ✓')"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["stdout"], "toujours là ✓\n", "{r}");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("still running 60 s after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}
