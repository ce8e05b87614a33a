//! The service serves before its fullest tier is up: `/ready` is 200 once a tier serves, a
//! job (or a session) routed to a tier still starting runs on one that serves, correctly
//! (it imports what it needs), and `/health` and `/metrics` show that tier `starting`;
//! once it is up, its jobs go to it. A fuller tier whose zygote cannot start leaves the
//! service serving, `/health` degraded naming the tier and why, and is retried.
//!
//! The fuller tier's start is held by a preloaded module that waits for a gate file the
//! test creates: no timing decides what the test sees.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use snakecage::metrics::names;

use crate::harness::{Options, Server, site_packages};

/// Long enough for a loaded machine; only a service that never gets there hits it.
const PATIENCE: Duration = Duration::from_secs(120);

/// A job only the `gated` tier's preloads cover: its imports route it there.
const PANDAS_JOB: &str =
    "import pandas as pd\nprint(pd.DataFrame({'été': [1, 2, 3]})['été'].sum())";

/// Writes a configuration with two tiers, `bare` (nothing preloaded) and `gated`
/// (pandas, and module `gate_module` with `source`), and returns it with the gate's path
/// (which does not exist yet). The zygote start timeout is raised so that a gate held
/// shut while the test runs its jobs does not count as a zygote that hangs.
fn gated_config(dir: &Path, gate_module: &str, source: &str) -> (PathBuf, Options, PathBuf) {
    let gate = dir.join("gate-ouvert");
    let source = source.replace("GATE", &format!("{:?}", gate.display().to_string()));
    let packages = site_packages(dir, &[(gate_module, &source)]);
    let config = dir.join("snakecage.toml");
    std::fs::write(
        &config,
        format!(
            "[python]\nsite_packages = [{:?}]\n\n\
             [[tiers.profile]]\nname = \"bare\"\npreload = []\n\n\
             [[tiers.profile]]\nname = \"gated\"\npreload = [{gate_module:?}, \"pandas\"]\n",
            packages.display().to_string()
        ),
    )
    .unwrap();
    let options = Options::default()
        .first_worker_only()
        .env("SNAKECAGE_POOL__SPAWN_TIMEOUT_MS", 120_000);
    (config, options, gate)
}

/// `/health`'s entry for tier `name`.
fn tier<'a>(health: &'a Value, name: &str) -> &'a Value {
    health["pool"]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tier {name}: {health}"))
}

/// Polls `/health` until `reached` holds.
async fn wait_for_health(s: &Server, what: &str, reached: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let health = s.health().await;
        if reached(&health) {
            return health;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {health}\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `/ready` until it is 200 (a service that waits for every tier never gets there
/// while the gate is shut).
async fn wait_until_ready(s: &Server) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, _, body) = s.get("/ready").await;
        if status == 200 {
            assert_eq!(body, r#"{"status":"ready"}"#);
            return;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            Instant::now() < deadline,
            "never ready: {body}\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The checkouts (`tier`, `routed`) that moved while `f` ran.
async fn checkouts_during<F: Future<Output = Value>>(
    s: &Server,
    f: F,
) -> (Value, Vec<(String, String)>) {
    let before = s.scrape().await;
    let value = f.await;
    let after = s.scrape().await;
    let mut moved = Vec::new();
    for (labels, count) in after.series(names::TIER_CHECKOUTS_TOTAL) {
        let (tier, routed) = (labels["tier"].clone(), labels["routed"].clone());
        let was = before.get_or_zero(
            names::TIER_CHECKOUTS_TOTAL,
            &[("tier", &tier), ("routed", &routed)],
        );
        for _ in 0..(count - was) as usize {
            moved.push((tier.clone(), routed.clone()));
        }
    }
    (value, moved)
}

/// Runs [`PANDAS_JOB`] (routed to `gated`) and checks that it ran, on tier `tier`.
async fn pandas_job_runs_on(s: &Server, tier: &str) {
    let (r, moved) = checkouts_during(
        s,
        s.run_with(json!({ "code": PANDAS_JOB, "timeout_ms": 60_000 })),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "6\n", "{r}");
    assert_eq!(moved, [pair(tier, "gated")]);
}

/// A preloaded module that kills its zygote, saying `words` on stderr, while the gate is
/// shut.
fn dies_while_the_gate_is_shut(module: &str, words: &str) -> String {
    format!(
        "import os, sys\nif not os.path.exists(GATE):\n    \
         sys.stderr.write('{module}: {words}\\n')\n    sys.stderr.flush()\n    os._exit(3)\n"
    )
}

fn pair(tier: &str, routed: &str) -> (String, String) {
    (tier.to_owned(), routed.to_owned())
}

#[tokio::test]
async fn a_job_routed_to_a_tier_still_starting_runs_on_one_that_serves() {
    let dir = tempfile::tempdir().unwrap();
    let (config, options, gate) = gated_config(
        dir.path(),
        "snakecage_gate",
        "import os, time\nwhile not os.path.exists(GATE):\n    time.sleep(0.02)\n",
    );
    let s = crate::rollover::start(&config, options).await;

    // The gated tier is preloading, and stays so until the gate opens: the service is
    // ready all the same.
    wait_until_ready(&s).await;
    let health = s.health().await;
    assert_eq!(health["status"], "ok", "starting is not a fault: {health}");
    assert_eq!(tier(&health, "bare")["state"], "serving", "{health}");
    let gated = tier(&health, "gated");
    assert_eq!(gated["state"], "starting", "{health}");
    assert_eq!(gated["zygote"], Value::Null, "{health}");
    assert_eq!(gated["start_error"], Value::Null, "{health}");
    let scrape = s.scrape().await;
    let state = |tier: &str, state: &str| {
        scrape.get(names::TIER_STATE, &[("tier", tier), ("state", state)])
    };
    assert_eq!(state("gated", "starting"), 1.0);
    assert_eq!(state("gated", "serving"), 0.0);
    assert_eq!(state("gated", "failed"), 0.0);
    assert_eq!(state("bare", "serving"), 1.0);

    // A job whose imports pick the gated tier runs on bare, which imports pandas itself.
    pandas_job_runs_on(&s, "bare").await;

    // So does a session (its tier, the fullest, is the gated one), and it keeps its worker
    // once the gated tier is up: it lives on the lighter tier.
    let (id, moved) = checkouts_during(&s, async { Value::String(s.new_session().await) }).await;
    let id = id.as_str().unwrap().to_owned();
    assert_eq!(moved, [pair("bare", "gated")]);
    let r = s
        .session_run(&id, "import pandas as pd\ns = pd.Series([1, 2])")
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");

    // The gate opens: once the gated tier has its zygote and a worker, its jobs go to it.
    std::fs::write(&gate, "").unwrap();
    wait_for_health(&s, "the gated tier serving", |h| {
        tier(h, "gated")["state"] == "serving" && tier(h, "gated")["idle"].as_u64() >= Some(1)
    })
    .await;
    pandas_job_runs_on(&s, "gated").await;
    let r = s.session_run(&id, "print(int(s.sum()))").await;
    assert_eq!(r["stdout"], "3\n", "{r}");
    let scrape = s.scrape().await;
    assert_eq!(
        scrape.get(
            names::TIER_STATE,
            &[("tier", "gated"), ("state", "serving")]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_fuller_tier_that_cannot_start_degrades_the_service_which_serves_and_retries_it() {
    let dir = tempfile::tempdir().unwrap();
    // The zygote dies while it preloads this module, as long as the gate is shut.
    let (config, options, gate) = gated_config(
        dir.path(),
        "snakecage_broken_model",
        &dies_while_the_gate_is_shut("snakecage_broken_model", "le modèle est introuvable"),
    );
    let s = crate::rollover::start(&config, options).await;

    let health = wait_for_health(&s, "the gated tier failing", |h| {
        tier(h, "gated")["state"] == "failed"
    })
    .await;
    // Said where an operator looks: degraded, the tier named with why.
    assert_eq!(health["status"], "degraded", "{health}");
    let gated = tier(&health, "gated");
    let why = gated["start_error"].as_str().unwrap();
    assert!(
        why.contains("exited before it was ready") && why.contains("le modèle est introuvable"),
        "{why}"
    );
    assert_eq!(gated["zygote"], Value::Null, "{health}");
    let scrape = s.scrape().await;
    assert_eq!(
        scrape.get(names::TIER_STATE, &[("tier", "gated"), ("state", "failed")]),
        1.0
    );
    assert!(
        s.log().contains("the tier's zygote could not start"),
        "{}",
        s.log()
    );
    // Every request is still served correctly: ready, and its jobs run on bare.
    wait_until_ready(&s).await;
    pandas_job_runs_on(&s, "bare").await;

    // The cause goes away: a retry brings the tier up, and the service is healthy again.
    std::fs::write(&gate, "").unwrap();
    let health = wait_for_health(&s, "the gated tier serving after a retry", |h| {
        tier(h, "gated")["state"] == "serving"
    })
    .await;
    assert_eq!(
        tier(&health, "gated")["start_error"],
        Value::Null,
        "{health}"
    );
    let health = wait_for_health(&s, "the service healthy again", |h| h["status"] == "ok").await;
    assert_eq!(health["ready"], true, "{health}");
}

#[tokio::test]
async fn a_fuller_tier_whose_zygote_dies_and_cannot_restart_leaves_the_service_ready() {
    let dir = tempfile::tempdir().unwrap();
    // The zygote dies while it preloads this module whenever the gate is shut: open at the
    // first start, shut for the restart.
    let (config, options, gate) = gated_config(
        dir.path(),
        "snakecage_flaky_model",
        &dies_while_the_gate_is_shut("snakecage_flaky_model", "le modèle a disparu"),
    );
    std::fs::write(&gate, "").unwrap();
    let s = crate::rollover::start(&config, options).await;
    let health = wait_for_health(&s, "the gated tier serving", |h| {
        tier(h, "gated")["state"] == "serving" && tier(h, "gated")["idle"].as_u64() >= Some(1)
    })
    .await;
    let zygote = tier(&health, "gated")["zygote"]["pid"].as_u64().unwrap() as i32;

    std::fs::remove_file(&gate).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let health = wait_for_health(&s, "the gated tier failing to restart", |h| {
        tier(h, "gated")["state"] == "failed"
    })
    .await;
    // Said where an operator looks: degraded, the tier named with why.
    assert_eq!(health["status"], "degraded", "{health}");
    let why = tier(&health, "gated")["start_error"].as_str().unwrap();
    assert!(
        why.starts_with("restarting the zygote failed") && why.contains("le modèle a disparu"),
        "{why}"
    );
    // Yet every request is served: the service stays ready (a balancer keeps sending it
    // traffic), and the dead tier's jobs run on bare rather than wait or be refused.
    let (status, _, body) = s.get("/ready").await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ready"}"#));
    assert_eq!(health["ready"], true, "{health}");
    pandas_job_runs_on(&s, "bare").await;

    // The cause goes away: a retry brings the tier back, and its jobs go to it again.
    std::fs::write(&gate, "").unwrap();
    wait_for_health(&s, "the gated tier restarted", |h| {
        tier(h, "gated")["state"] == "serving" && tier(h, "gated")["idle"].as_u64() >= Some(1)
    })
    .await;
    let health = wait_for_health(&s, "the service healthy again", |h| h["status"] == "ok").await;
    assert_eq!(
        tier(&health, "gated")["start_error"],
        Value::Null,
        "{health}"
    );
    assert_eq!(tier(&health, "gated")["zygote"]["restarts"], 1, "{health}");
    pandas_job_runs_on(&s, "gated").await;
}
