//! Operator package management against the real service: `/v1/admin/packages` installs
//! for real (the configured index), rolls the pool over under load, survives a restart,
//! and refuses what does not resolve or does not import, changing nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use snakecage::metrics::names;

use crate::harness::{Options, Server, check_error_body, repo_root};
use crate::load::Load;
use crate::packages_env::{crashing_package, env_dirs, shared_uv_cache};

/// Installs and rollovers take seconds (minutes with a cold cache): generous, never timed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(600);

/// Options for a server that can manage packages: the pinned uv, the tests' shared cache.
pub fn managed(options: Options) -> Options {
    options
        .env(
            "SNAKECAGE_PACKAGES__UV",
            repo_root().join(".venv-tools/bin/uv").display(),
        )
        .env("SNAKECAGE_PACKAGES__CACHE_DIR", shared_uv_cache().display())
}

/// A request to an admin route: the status and the body.
pub async fn admin(
    s: &Server,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = s
        .client
        .request(method, format!("{}{path}", s.base))
        .timeout(CHANGE_TIMEOUT);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status >= 400 {
        check_error_body(status, &body);
    }
    (status, body)
}

async fn generation(s: &Server) -> u64 {
    let (status, list) = s.get_json("/v1/admin/packages").await;
    assert_eq!(status, 200, "{list}");
    list["generation"]["id"].as_u64().unwrap()
}

/// Rollovers counted so far that succeeded.
async fn rollovers(s: &Server) -> f64 {
    s.scrape()
        .await
        .get(names::ROLLOVERS_TOTAL, &[("outcome", "succeeded")])
}

/// The version `/v1/packages` reports for the import name `name`, if it lists it.
async fn listed_version(s: &Server, name: &str) -> Option<String> {
    let (status, packages) = s.get_json("/v1/packages").await;
    assert_eq!(status, 200, "{packages}");
    packages["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name && p["installed"] == true)
        .map(|p| p["version"].as_str().unwrap_or_default().to_owned())
}

/// The `site-packages` directory of the environment at `env`, found as the service finds
/// a venv's.
fn site_packages(env: &Path) -> PathBuf {
    let python = snakecage::config::PythonConfig {
        venv: Some(env.to_path_buf()),
        ..Default::default()
    };
    let mut layout = python.layout().unwrap();
    layout.site_packages.remove(0)
}

/// `package/__init__.py` has bytecode in `__pycache__` that CPython accepts for it: a
/// timestamp pyc records the source's mtime and size (PEP 552), and they must match.
fn assert_compiled(package: &Path) {
    let source = std::fs::metadata(package.join("__init__.py")).unwrap();
    let cache = package.join("__pycache__");
    let pyc = std::fs::read_dir(&cache)
        .unwrap_or_else(|e| panic!("no bytecode in {}: {e}", cache.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("__init__.cpython-") && name.ends_with(".pyc")
        })
        .unwrap_or_else(|| panic!("no __init__ bytecode in {}", cache.display()));
    let bytes = std::fs::read(&pyc).unwrap();
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let flags = word(4);
    if flags == 0 {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            word(8),
            source.mtime() as u32,
            "stale mtime in {}",
            pyc.display()
        );
        assert_eq!(
            word(12),
            source.len() as u32,
            "stale size in {}",
            pyc.display()
        );
    } else {
        // A hash-based pyc that is not checked against its source would serve a stale one.
        assert_eq!(
            flags,
            0b11,
            "{}: unchecked hash-based bytecode",
            pyc.display()
        );
    }
}

#[tokio::test]
async fn an_added_package_serves_after_a_switch_with_no_failed_request_and_survives_a_restart() {
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let s = Server::start_with(managed(Options::default().state_dir(state.path()))).await;
    let before = generation(&s).await;
    let denied = s.run("import tabulate").await;
    assert!(
        denied["stderr"]
            .as_str()
            .unwrap()
            .contains("import of 'tabulate' is not allowed in this sandbox"),
        "{denied}"
    );
    let sid = s.new_session().await;
    s.session_run(&sid, "x = 41\nnames = ['é', '漢']").await;

    let load = Load::start(&s, 4);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, added) = admin(
        &s,
        reqwest::Method::POST,
        "/v1/admin/packages",
        None,
        Some(json!({ "add": ["tabulate==0.9.0"] })),
    )
    .await;
    assert_eq!(status, 200, "{added}");
    // A little more load on the new generation, then stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, failures) = load.finish().await;
    assert!(
        failures.is_empty(),
        "{} failed requests: {failures:?}",
        failures.len()
    );
    assert!(ok > 0, "the load ran no request");
    assert_eq!(added["changed"][0]["name"], "tabulate", "{added}");
    assert_eq!(added["changed"][0]["version"], "0.9.0", "{added}");
    assert_eq!(added["changed"][0]["import_names"], json!(["tabulate"]));
    assert_eq!(added["requested"], json!(["tabulate==0.9.0"]));
    assert_eq!(added["rolled_over"], true, "{added}");
    assert_eq!(
        added["generation"]["id"].as_u64(),
        Some(before + 1),
        "{added}"
    );
    assert_eq!(
        generation(&s).await,
        added["generation"]["id"].as_u64().unwrap()
    );
    // The new environment has bytecode for what changed and for what did not: workers
    // cannot write any, and would compile every import that is not preloaded from source.
    let env = env_dirs(state.path()).pop().expect("the new environment");
    let site = site_packages(&env);
    for package in ["tabulate", "numpy", "scipy/stats"] {
        assert_compiled(&site.join(package));
    }

    // The same add again, and a sync of the same requirements: nothing to do, no rollover.
    let counted = rollovers(&s).await;
    assert_eq!(counted, 1.0);
    let (status, again) = admin(
        &s,
        reqwest::Method::POST,
        "/v1/admin/packages",
        None,
        Some(json!({ "add": ["Tabulate==0.9.0"] })),
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["rolled_over"], false, "{again}");
    assert_eq!(
        again["generation"]["id"], added["generation"]["id"],
        "{again}"
    );
    assert_eq!(again["environment"], added["environment"], "{again}");
    assert_eq!(again["changed"], json!([]), "{again}");
    assert_eq!(again["requested"], json!(["tabulate==0.9.0"]), "{again}");
    let message = again["message"].as_str().unwrap();
    assert!(
        message.contains("tabulate==0.9.0 already installed as requested"),
        "{message}"
    );
    let synced = s
        .client
        .post(format!("{}/v1/admin/packages/sync", s.base))
        .header("content-type", "text/plain")
        .body("# the same set\ntabulate==0.9.0\n")
        .timeout(CHANGE_TIMEOUT)
        .send()
        .await
        .unwrap();
    assert_eq!(synced.status(), 200);
    let synced: Value = synced.json().await.unwrap();
    assert_eq!(synced["rolled_over"], false, "{synced}");
    assert_eq!(synced["generation"]["id"], added["generation"]["id"]);
    assert_eq!(rollovers(&s).await, counted);
    assert_eq!(generation(&s).await, before + 1);

    // The session kept its variables (it stays on its generation until it ends).
    let r = s.session_run(&sid, "print(x + 1, ''.join(names))").await;
    assert_eq!(r["stdout"], "42 é漢\n", "{r}");
    // New runs import it, and pandas finds it for to_markdown().
    let r = s
        .run("import pandas as pd\nprint(pd.DataFrame({'ä': [1, 2]}).to_markdown())")
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["stdout"].as_str().unwrap().contains("|   ä |"), "{r}");
    let r = s.run("import tabulate\nprint(tabulate.__version__)").await;
    assert_eq!(r["stdout"], "0.9.0\n", "{r}");
    assert_eq!(
        listed_version(&s, "tabulate").await.as_deref(),
        Some("0.9.0")
    );
    let (status, list) = s.get_json("/v1/admin/packages").await;
    assert_eq!(status, 200);
    assert_eq!(list["managed"], true, "{list}");
    let tab = list["distributions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "tabulate")
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(tab["added"], true);
    let env = list["environment"].as_str().unwrap().to_owned();
    assert!(
        Path::new(&env).starts_with(state.path().join("envs")),
        "{env}"
    );

    // A restart: the managed environment is used (and said so), the package still there.
    drop(s);
    let s = Server::start_with(managed(Options::default().state_dir(state.path()))).await;
    assert!(
        s.log().contains("using the managed Python environment"),
        "{}",
        s.log()
    );
    assert_eq!(
        listed_version(&s, "tabulate").await.as_deref(),
        Some("0.9.0")
    );
    let r = s.run("import tabulate\nprint(tabulate.__version__)").await;
    assert_eq!(r["stdout"], "0.9.0\n", "{r}");
    assert_eq!(env_dirs(state.path()), [PathBuf::from(&env)]);

    // A reload re-reads the configuration; the operator's packages stay.
    let (status, reloaded) = admin(&s, reqwest::Method::POST, "/v1/admin/reload", None, None).await;
    assert_eq!(status, 200, "{reloaded}");
    let r = s.run("import tabulate\nprint(tabulate.__version__)").await;
    assert_eq!(r["stdout"], "0.9.0\n", "{r}");
    assert_eq!(
        listed_version(&s, "tabulate").await.as_deref(),
        Some("0.9.0")
    );

    // Remove it: new runs get the import guard's error.
    let (status, removed) = admin(
        &s,
        reqwest::Method::DELETE,
        "/v1/admin/packages?name=tabulate",
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(removed["removed"], json!(["tabulate"]), "{removed}");
    assert_eq!(removed["requested"], json!([]), "{removed}");
    // The previous generation's environment goes once its zygotes have retired (a sweep
    // follows each switch), never the one in use.
    let now_serving = PathBuf::from(removed["environment"].as_str().unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while env_dirs(state.path()) != [now_serving.clone()] {
        assert!(
            std::time::Instant::now() < deadline,
            "the old environment was never removed: {:?}",
            env_dirs(state.path())
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let r = s.run("import tabulate").await;
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("import of 'tabulate' is not allowed in this sandbox"),
        "{r}"
    );
    assert_eq!(listed_version(&s, "tabulate").await, None);
    // Removing it again: it is gone already, nothing rolls over.
    let serving = generation(&s).await;
    let counted = rollovers(&s).await;
    let (status, body) = admin(
        &s,
        reqwest::Method::DELETE,
        "/v1/admin/packages",
        None,
        Some(json!({ "remove": ["tabulate"] })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_over"], false, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("tabulate installed nowhere"),
        "{body}"
    );
    assert_eq!(body["generation"]["id"].as_u64(), Some(serving), "{body}");
    assert_eq!(generation(&s).await, serving);
    assert_eq!(rollovers(&s).await, counted);
    // A base package is not the operator's to remove: refused, naming why.
    let (status, body) = admin(
        &s,
        reqwest::Method::DELETE,
        "/v1/admin/packages?name=numpy",
        None,
        None,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("part of the base environment"),
        "{body}"
    );
}

#[tokio::test]
async fn bad_requests_and_a_spec_that_does_not_exist_change_nothing() {
    let s = Server::start_with(managed(Options::default())).await;
    let before = generation(&s).await;
    let post = |body: Value| {
        admin(
            &s,
            reqwest::Method::POST,
            "/v1/admin/packages",
            None,
            Some(body),
        )
    };

    let (status, body) = post(json!({ "add": ["snakecage-no-such-package-zz==1.0"] })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "install_failed");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("snakecage-no-such-package-zz")
            && detail.contains("not found in the package registry"),
        "the installer's own words: {detail}"
    );

    // A marker false for the workers' interpreter: uv installs nothing for it. Refused
    // with what to fix, and nothing was recorded or switched (checked below).
    let (status, body) = post(json!({ "add": ["six; os_name==\"nt\""] })).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "invalid_request", "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(
            "its environment marker `os_name == 'nt'` is false for the service's Python environment"
        ) && detail.contains("drop the marker")
            && detail.contains("Nothing changed"),
        "{detail}"
    );

    let many: Vec<String> = (0..1000).map(|i| format!("pkg{i}")).collect();
    for (body, needle) in [
        (
            json!({ "add": ["tabulate; rm -rf /"] }),
            "not a valid requirement",
        ),
        (json!({ "add": ["$(reboot)"] }), "not a valid requirement"),
        (
            json!({ "add": ["tabulate @ https://example.com/t.whl"] }),
            "configured index",
        ),
        (
            json!({ "add": ["--index-url=http://evil/simple"] }),
            "options",
        ),
        (json!({ "add": ["tablé==1"] }), "not a valid requirement"),
        (json!({ "add": [] }), "at least one"),
        (json!({ "add": many }), "at most 100"),
        (json!({ "add": "tabulate" }), "invalid request body"),
        (json!({ "install": ["tabulate"] }), "invalid request body"),
    ] {
        let (status, r) = post(body.clone()).await;
        assert_eq!(status, 422, "{body}: {r}");
        assert!(
            r["detail"].as_str().unwrap().contains(needle),
            "{body}: {r}"
        );
    }
    let (status, r) = admin(
        &s,
        reqwest::Method::DELETE,
        "/v1/admin/packages",
        None,
        None,
    )
    .await;
    assert_eq!(status, 422, "{r}");
    let (status, r) = admin(
        &s,
        reqwest::Method::DELETE,
        "/v1/admin/packages?name=numpy",
        None,
        None,
    )
    .await;
    assert_eq!(status, 422, "{r}");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("part of the base environment"),
        "{r}"
    );
    let resp = s
        .client
        .post(format!("{}/v1/admin/packages/sync", s.base))
        .header("content-type", "text/plain")
        .body("tabulate\n--extra-index-url https://evil/simple\n")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let r: Value = resp.json().await.unwrap();
    assert!(r["detail"].as_str().unwrap().contains("line 2"), "{r}");

    // Nothing changed: the same generation, no environment directory left behind.
    assert_eq!(generation(&s).await, before);
    assert!(
        env_dirs(s.state_dir()).is_empty(),
        "{:?}",
        env_dirs(s.state_dir())
    );
    let (_, list) = s.get_json("/v1/admin/packages").await;
    assert_eq!(list["managed"], false, "{list}");
    assert_eq!(list["requested"], json!([]), "{list}");
}

#[tokio::test]
async fn a_package_whose_import_crashes_the_probe_never_serves() {
    let scratch = tempfile::tempdir().unwrap();
    let wheels = crashing_package(scratch.path(), "--wheel");
    let s = Server::start_with(managed(Options::default().env(
        "SNAKECAGE_PACKAGES__FIND_LINKS",
        format!("[{:?}]", wheels.display().to_string()),
    )))
    .await;
    let before = generation(&s).await;
    let (status, body) = admin(
        &s,
        reqwest::Method::POST,
        "/v1/admin/packages",
        None,
        Some(json!({ "add": ["snakecage-crash-probe==1.0"] })),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "rollover_failed", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("snakecage_crash_probe"),
        "{body}"
    );
    // Nothing switched and nothing is left: the same generation, no directory, not listed.
    assert_eq!(generation(&s).await, before);
    assert!(
        env_dirs(s.state_dir()).is_empty(),
        "{:?}",
        env_dirs(s.state_dir())
    );
    assert_eq!(listed_version(&s, "snakecage_crash_probe").await, None);
    let r = s.run("print(6 * 7)").await;
    assert_eq!(r["stdout"], "42\n", "{r}");
}
