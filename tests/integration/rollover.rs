//! Generations and rollover: `POST /v1/admin/reload` under load switches to a new zygote
//! generation with zero failed requests while a session keeps its worker (and its
//! generation); the admin routes need the admin scope (or loopback without keys); one
//! rollover at a time; keys a reload cannot apply are named. Failed rollovers are in
//! `rollover_failures`, reloads that change nothing in `rollover_unchanged`.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::header::AUTHORIZATION;
use serde_json::{Value, json};
use snakecage::metrics::names;

use crate::agents::mcp_client_with;
use crate::auth::keys_add;
use crate::harness::{Options, Server, check_error_body, children_of, repo_root};
use crate::load::Load;
use crate::prom::Scrape;
use crate::reliability::eventually;

/// Two light tiers, so a rollover starts quickly on a shared machine.
pub const TIERS: &str = r#"
[tiers]
min_idle = 1

[[tiers.profile]]
name = "bare"
preload = []

[[tiers.profile]]
name = "scientific"
preload = ["numpy"]
"#;

/// A configuration file with `TIERS`, `allowed` as `sandbox.allowed_packages`, and `extra`.
pub fn write_config(path: &Path, allowed: &[&str], extra: &str) {
    let allowed: Vec<String> = allowed.iter().map(|p| format!("{p:?}")).collect();
    let text = format!(
        "{TIERS}\n[sandbox]\nallowed_packages = [{}]\n{extra}",
        allowed.join(", ")
    );
    std::fs::write(path, text).unwrap();
}

/// A pool started in this process from the configuration file `file`, one worker, its
/// state in `dir`: for tests that drive `Pool::prepare` themselves. Returns the pool, the
/// configuration and the settings it started with.
pub async fn start_pool(
    dir: &Path,
    file: &Path,
) -> (
    snakecage::pool::Pool,
    snakecage::config::Config,
    snakecage::pool::PoolSettings,
) {
    use snakecage::config::{Config, Overrides};
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let overrides = Overrides {
        venv: Some(repo_root().join(".venv")),
        pool_size: Some(1),
        ..Overrides::default()
    };
    let mut config = Config::load(Some(file), &overrides).unwrap();
    config.worker.state_dir = state.clone();
    config.workspace.dir = Some(state);
    let settings = snakecage::server::pool_settings(&config).unwrap();
    std::fs::create_dir_all(&settings.tiers[0].zygote.mpl_config_dir).unwrap();
    let pool = snakecage::pool::Pool::start(settings.clone())
        .await
        .unwrap();
    assert_eq!(pool.generation(), 1);
    (pool, config, settings)
}

pub async fn start(config: &Path, options: Options) -> Server {
    Server::start_with(options.arg("--config").arg(config.to_str().unwrap())).await
}

pub async fn reload(s: &Server, key: Option<&str>) -> (u16, Value) {
    reload_at(s, "/v1/admin/reload", key).await
}

pub async fn reload_at(s: &Server, path: &str, key: Option<&str>) -> (u16, Value) {
    let mut request = s.client.post(format!("{}{path}", s.base));
    if let Some(key) = key {
        request = request.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status >= 400 {
        check_error_body(status, &body);
    }
    (status, body)
}

/// The names `/v1/packages` lists as third-party packages user code may import.
pub async fn allowed_packages(s: &Server) -> Vec<String> {
    listed_packages(s)
        .await
        .into_iter()
        .map(|(name, ..)| name)
        .collect()
}

/// Each package `/v1/packages` lists: its name, whether it is installed, its version.
pub async fn listed_packages(s: &Server) -> Vec<(String, bool, Option<String>)> {
    let (status, body) = s.get_json("/v1/packages").await;
    assert_eq!(status, 200, "{body}");
    body["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["installed"].as_bool().unwrap(),
                p["version"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

pub async fn generation(s: &Server) -> u64 {
    s.health().await["generation"]["id"].as_u64().unwrap()
}

/// The pid of each tier's zygote.
pub async fn zygote_pids(s: &Server) -> Vec<u64> {
    let health = s.health().await;
    health["pool"]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["zygote"]["pid"].as_u64().unwrap())
        .collect()
}

/// The `run_python` description an MCP client is given now.
async fn mcp_description(s: &Server) -> String {
    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || mcp_client_with(&base, "describe", &[]))
        .await
        .unwrap();
    out["run_python_description"].as_str().unwrap().to_owned()
}

/// The rollover metrics: successes, failures, and the generation in use.
pub fn assert_rollovers(scrape: &Scrape, succeeded: u32, failed: u32, generation: u32) {
    let outcome = |o| scrape.get(names::ROLLOVERS_TOTAL, &[("outcome", o)]);
    assert_eq!(outcome("succeeded"), f64::from(succeeded));
    assert_eq!(outcome("failed"), f64::from(failed));
    assert_eq!(scrape.get(names::GENERATION, &[]), f64::from(generation));
}

#[tokio::test]
async fn reload_under_load_switches_generations_with_zero_failures_and_sessions_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy", "openpyxl"], "");
    let s = start(&config, Options::default()).await;
    assert_eq!(generation(&s).await, 1);
    assert!(allowed_packages(&s).await.contains(&"openpyxl".to_owned()));
    let r = s.run("import openpyxl\nprint('ok')").await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
    let (_, tools) = s.get_json("/v1/tools").await;
    assert!(tools.to_string().contains("openpyxl"), "{tools}");
    assert!(mcp_description(&s).await.contains("openpyxl"));

    // A session holding a variable, on generation 1.
    let (status, created) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["session_id"].as_str().unwrap().to_owned();
    let server = &s;
    let run_in = |code: &str| {
        let body = json!({ "code": code });
        let path = format!("/v1/sessions/{id}/execute");
        async move { server.post(&path, &body).await }
    };
    let (status, r) = run_in("x = 'naïve 41'").await;
    assert_eq!(status, 200, "{r}");

    let load = Load::start(&s, 4);
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_config(&config, &["numpy"], "");
    let (status, info) = reload(&s, None).await;
    assert_eq!(status, 200, "{info}\n{}", s.log());
    assert_eq!(info["id"], 2, "{info}");
    assert_eq!(info["rolled_over"], true, "{info}");
    assert_eq!(info["reason"], "reload");
    assert_eq!(info["previous"], 1);
    assert!(info["took_ms"].as_u64().is_some(), "{info}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (succeeded, failed) = load.finish().await;
    assert!(
        failed.is_empty(),
        "{} requests failed: {failed:?}",
        failed.len()
    );
    assert!(succeeded > 10, "only {succeeded} requests ran");

    // The session kept its worker, its variable and its generation.
    let (status, r) = run_in("print(x.replace('41', '42'))").await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "naïve 42\n", "{r}");
    let health = s.health().await;
    assert_eq!(health["generation"]["id"], 2, "{health}");
    assert_eq!(health["generation"]["reason"], "reload", "{health}");
    assert!(
        health["generation"]["started_at"].as_str().is_some(),
        "{health}"
    );
    assert_eq!(
        health["sessions"]["by_generation"],
        json!({ "1": 1 }),
        "{health}"
    );
    assert_eq!(health["pool"]["generation"], 2, "{health}");
    let retired = health["pool"]["retired_generations"].as_array().unwrap();
    assert!(
        retired
            .iter()
            .any(|g| g["id"] == 1 && g["in_use"].as_u64() >= Some(1)),
        "{health}"
    );
    let (_, info) = s.get_json(&format!("/v1/sessions/{id}")).await;
    assert_eq!(info["generation"], 1, "{info}");

    // New runs see the new allowlist: the packages list and the import guard.
    assert!(!allowed_packages(&s).await.contains(&"openpyxl".to_owned()));
    let r = s.run("import openpyxl").await;
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("import of 'openpyxl' is not allowed in this sandbox"),
        "{r}"
    );
    let (_, tools) = s.get_json("/v1/tools").await;
    assert!(!tools.to_string().contains("openpyxl"), "{tools}");
    let description = mcp_description(&s).await;
    assert!(
        !description.contains("openpyxl") && description.contains("numpy"),
        "{description}"
    );
    let (_, status) = s.get_json("/v1/status").await;
    assert_eq!(status["generation"]["id"], 2, "{status}");
    assert!(
        !status["packages"].to_string().contains("openpyxl"),
        "{status}"
    );

    let scrape = s.scrape().await;
    assert_rollovers(&scrape, 1, 0, 2);
    assert_eq!(scrape.series(names::BUILD_INFO).len(), 1);
    let count = format!("{}_count", names::ROLLOVER_DURATION_SECONDS);
    assert_eq!(scrape.sum(&count, &[]), 1.0);

    // Once the session ends nothing uses generation 1: its zygotes are shut down.
    let response = s
        .client
        .delete(format!("{}/v1/sessions/{id}", s.base))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = s.health().await;
        if health["pool"]["retired_generations"] == json!([]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "generation 1 was never collected: {health}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.run("print(1 + 1)").await["stdout"], "2\n");
}

#[tokio::test]
async fn admin_routes_need_the_admin_scope_and_keys_a_reload_cannot_apply_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let admin = keys_add(&keys, "ops", &["--admin"]);
    let user = keys_add(&keys, "alice", &[]);
    let text = std::fs::read_to_string(&keys).unwrap();
    assert!(text.contains("scopes = [\"admin\"]"), "{text}");
    let config = dir.path().join("snakecage.toml");
    write_config(
        &config,
        &["numpy"],
        &format!("\n[auth]\nkeys_file = {:?}\n", keys.display().to_string()),
    );
    let s = start(&config, Options::default()).await;

    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = reload(&s, Some(&user)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "forbidden");
    assert!(
        body["detail"].as_str().unwrap().contains("'alice'"),
        "{body}"
    );
    assert_eq!(generation(&s).await, 1);

    // Two at once: one runs, the other is told (409) and changes nothing.
    write_config(
        &config,
        &["numpy", "openpyxl"],
        &format!("\n[auth]\nkeys_file = {:?}\n", keys.display().to_string()),
    );
    let (a, b) = tokio::join!(reload(&s, Some(&admin)), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        reload(&s, Some(&admin)).await
    });
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{a:?} {b:?}");
    let busy = if a.0 == 409 { &a.1 } else { &b.1 };
    assert_eq!(busy["code"], "rollover_in_progress", "{busy}");
    assert!(
        busy["detail"]
            .as_str()
            .unwrap()
            .contains("already in progress"),
        "{busy}"
    );
    assert_eq!(generation(&s).await, 2);

    // Keys a running service cannot take are named, and nothing changes.
    write_config(
        &config,
        &["numpy", "openpyxl"],
        &format!(
            "\n[auth]\nkeys_file = {:?}\n\n[sessions]\nmax_sessions = 3\n\n[files]\nmax_file_size_mb = 7\n",
            keys.display().to_string()
        ),
    );
    let (status, body) = reload(&s, Some(&admin)).await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("sessions.max_sessions") && detail.contains("files.max_file_size_mb"),
        "{detail}"
    );
    assert!(detail.contains("without a restart"), "{detail}");
    assert_eq!(generation(&s).await, 2);
}

#[tokio::test]
async fn without_keys_the_admin_routes_answer_on_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy"], "");
    let s = start(&config, Options::default()).await;
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 200, "{body}");
    drop(s);

    let s = start(
        &config,
        Options::default()
            .listen("0.0.0.0:0")
            .arg("--allow-unauthenticated"),
    )
    .await;
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("beyond loopback"),
        "{body}"
    );
    assert_eq!(generation(&s).await, 1);
}

/// A reload re-reads the file, the environment and the flags: an edit of a setting that a
/// flag or a variable overrides is not applied, and the answer says which source wins,
/// with both values, instead of only "nothing changed".
#[tokio::test]
async fn a_reload_names_the_files_settings_a_flag_or_a_variable_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("réglages.toml");
    write_config(&config, &["numpy"], "");
    let s = start(
        &config,
        Options::default()
            .arg("--pool-size")
            .arg("2")
            .env("SNAKECAGE_LIMITS__MEMORY_LIMIT_MB", 300),
    )
    .await;

    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("overridden").is_none(), "{body}");

    write_config(
        &config,
        &["numpy"],
        "\n[pool]\nsize = 3\n\n[limits]\nmemory_limit_mb = 400\n",
    );
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], false, "{body}");
    let file = config.display();
    assert_eq!(
        body["overridden"],
        json!([
            format!(
                "limits.memory_limit_mb = 400 in {file} is overridden by SNAKECAGE_LIMITS__MEMORY_LIMIT_MB (300)"
            ),
            format!("pool.size = 3 in {file} is overridden by --pool-size (2)"),
        ]),
        "{body}"
    );
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("nothing changed: ")
            && message.contains("Not applied: limits.memory_limit_mb = 400")
            && message.contains("change them and restart"),
        "{message}"
    );
    assert_eq!(generation(&s).await, 1);
}

/// A reload whose client leaves before the answer (a proxy's timeout, `curl -m`) still
/// completes: the new generation serves, and the service's only zygotes are its own. A
/// reload dropped midway left the new generation's zygotes running, serving nothing,
/// until the service stopped.
#[tokio::test]
async fn a_reload_whose_client_leaves_completes_and_leaves_no_zygote_behind() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy"], "");
    let s = start(&config, Options::default()).await;
    let first = zygote_pids(&s).await;
    for _ in 0..2 {
        let left = s
            .client
            .post(format!("{}/v1/admin/reload?force=true", s.base))
            .timeout(Duration::from_millis(100))
            .send()
            .await;
        assert!(left.as_ref().is_err_and(|e| e.is_timeout()), "{left:?}");
        // A reload without `force` gets 409 while the left one runs, then 200 with
        // nothing changed.
        eventually(60, "no reload running", async || {
            reload(&s, None).await.0 == 200
        })
        .await;
    }
    // Each of the two that were left rolled over; those that answered changed nothing.
    assert_eq!(generation(&s).await, 3, "{}", s.log());
    let serving = zygote_pids(&s).await;
    assert!(
        serving.iter().all(|p| !first.contains(p)),
        "{first:?} {serving:?}"
    );
    let mut serving: Vec<u32> = serving.into_iter().map(|p| p as u32).collect();
    serving.sort_unstable();
    eventually(30, "only the serving generation's zygotes", async || {
        let mut zygotes = children_of(s.pid());
        zygotes.sort_unstable();
        zygotes == serving
    })
    .await;
}
