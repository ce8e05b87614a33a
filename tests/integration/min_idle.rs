//! `tiers.min_idle = 0`: a tier with no demand keeps no idle worker, yet the service starts
//! and says it is ready, and a rollover still probes every tier (a worker forked for the
//! probe, not an idle one such a tier never gets), switches, and leaves each tier the idle
//! workers its target asks for; a tier whose workers cannot start still fails it.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::Options;
use crate::rollover::{allowed_packages, generation, reload, start, start_pool};

/// Two tiers (started with one execution slot: all the idle share goes to one tier, the
/// other keeps none). A short spawn timeout bounds each rollover step (four of it) so that a rollover
/// waiting for a worker that never comes fails in seconds, not minutes.
fn write_config(path: &Path, allowed: &[&str]) {
    let allowed: Vec<String> = allowed.iter().map(|p| format!("{p:?}")).collect();
    let text = format!(
        r#"
[pool]
spawn_timeout_ms = 5000

[tiers]
min_idle = 0

[[tiers.profile]]
name = "bare"
preload = []

[[tiers.profile]]
name = "scientific"
preload = ["numpy"]

[sandbox]
allowed_packages = [{}]
"#,
        allowed.join(", ")
    );
    std::fs::write(path, text).unwrap();
}

/// Each tier's (name, target_idle, idle, spawning) as `/health` reports them.
fn tiers(health: &Value) -> Vec<(String, u64, u64, u64)> {
    health["pool"]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["target_idle"].as_u64().unwrap(),
                t["idle"].as_u64().unwrap(),
                t["spawning"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn with_min_idle_zero_the_service_is_ready_and_a_reload_probes_every_tier_and_switches() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy"]);
    let s = start(&config, Options::default().env("SNAKECAGE_POOL__SIZE", 1)).await;

    // Started: the tier with the pool's one idle worker has it, the other keeps none,
    // and the service is ready.
    let (status, body) = s.get_json("/ready").await;
    assert_eq!(status, 200, "{body}");
    let health = s.health().await;
    assert_eq!(health["ready"], true, "{health}");
    let started = tiers(&health);
    assert_eq!(
        started.iter().map(|t| t.1).collect::<Vec<_>>(),
        [1, 0],
        "{health}"
    );
    assert_eq!((started[1].2, started[1].3), (0, 0), "{health}");

    // A changed setting rolls over: the scientific tier, with no idle target, is probed
    // in a worker of its own and the new generation serves.
    write_config(&config, &["numpy", "openpyxl"]);
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], true, "{body}");
    assert_eq!(generation(&s).await, 2);
    assert!(allowed_packages(&s).await.contains(&"openpyxl".to_owned()));

    // The probe's worker is gone with its job; no tier keeps more than its target asks.
    let health = s.health().await;
    let switched = tiers(&health);
    assert_eq!(
        switched.iter().map(|t| t.1).collect::<Vec<_>>(),
        [1, 0],
        "{health}"
    );
    assert_eq!(
        (switched[1].2, switched[1].3),
        (0, 0),
        "the scientific tier keeps no idle worker: {health}"
    );
    let (status, body) = s.get_json("/ready").await;
    assert_eq!(status, 200, "{body}");

    // Both tiers of the new generation serve.
    let r = s.run("print('bare')").await;
    assert_eq!(r["stdout"], "bare\n", "{r}");
    let r = s
        .run("import numpy, openpyxl\nprint(numpy.add(1, 2))")
        .await;
    assert_eq!(r["stdout"], "3\n", "{r}");

    // A forced reload of the same settings rolls over too.
    let (status, body) = crate::rollover::reload_at(&s, "/v1/admin/reload?force=true", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], true, "{body}");
    assert_eq!(generation(&s).await, 3);
}

/// A tier whose workers cannot start fails the rollover even when it keeps no idle worker
/// (its probe's worker is what fails), and the pool keeps its generation.
#[tokio::test]
async fn a_tier_with_no_idle_target_whose_workers_cannot_start_fails_the_rollover() {
    use snakecage::pool::RolloverStage;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snakecage.toml");
    write_config(&file, &["numpy"]);
    let (pool, _, settings) = start_pool(dir.path(), &file).await;

    // The scientific tier's workers get too few file descriptors to harden themselves.
    let mut broken = settings.clone();
    broken.tiers[1].zygote.limits.max_open_files = 3;
    let err = pool
        .prepare(broken, &[], "test")
        .await
        .err()
        .expect("a tier whose workers cannot start fails the rollover");
    assert_eq!(err.stage, RolloverStage::Worker, "{err}");
    assert!(err.detail.starts_with("tier scientific: "), "{err}");
    assert!(err.detail.contains("did not become ready"), "{err}");
    assert!(err.detail.contains("Too many open files"), "{err}");
    assert_eq!(pool.generation(), 1);

    // The same settings unbroken switch.
    let prepared = tokio::time::timeout(
        Duration::from_secs(300),
        pool.prepare(settings, &[], "test"),
    )
    .await
    .expect("a rollover of working tiers ends")
    .unwrap();
    pool.switch(prepared);
    assert_eq!(pool.generation(), 2);
    pool.shutdown().await;
}

/// `/ready` never goes back once every tier that wanted a worker has had one: a tier that
/// wanted none (and has had none) and is then asked for its first worker by a job is a
/// spawn away, not a reason to take the service out of a load balancer.
#[tokio::test]
async fn with_min_idle_zero_ready_stays_ready_when_a_job_first_asks_a_tier_for_a_worker() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy"]);
    let s = start(&config, Options::default().env("SNAKECAGE_POOL__SIZE", 1)).await;
    let health = s.health().await;
    let scientific = &health["pool"]["tiers"][1];
    assert_eq!(scientific["name"], "scientific", "{health}");
    assert_eq!(scientific["target_idle"], 0, "{health}");
    assert_eq!(scientific["workers_spawned"], 0, "{health}");
    let (status, body) = s.get_json("/ready").await;
    assert_eq!(status, 200, "{body}");

    // Its zygote held still (it cannot fork), a job routed to it asks it for a worker: the
    // job does not wait for it (a tier that serves runs it), and the service stays ready.
    let zygote = Pid::from_raw(scientific["zygote"]["pid"].as_u64().unwrap() as i32);
    kill(zygote, Signal::SIGSTOP).unwrap();
    let r = s
        .run_with(json!({ "code": "import numpy\nprint(numpy.add(1, 2))" }))
        .await;
    let (status, body) = s.get_json("/ready").await;
    let health = s.health().await;
    kill(zygote, Signal::SIGCONT).unwrap();
    assert_eq!(r["stdout"], "3\n", "{r}");
    assert_eq!(status, 200, "{body}");
    assert_eq!(health["ready"], true, "{health}");
    let tiers = &health["pool"]["tiers"];
    assert_eq!(tiers[1]["workers_spawned"], 0, "{health}");
    assert_eq!(tiers[0]["checkouts"], 1, "the job ran on bare: {health}");
}
