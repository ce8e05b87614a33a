//! Rollovers that fail change nothing and say why: a preload that raises, a module that
//! does not exist, an interpreter prefix that does not exist, a configuration that does
//! not parse; the pool's own probe reports an import's traceback. Failed attempts leave no
//! gap in the generation ids.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::Options;
use crate::rollover::{
    allowed_packages, assert_rollovers, generation, reload, start, start_pool, write_config,
};

#[tokio::test]
async fn a_failing_rollover_changes_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("snakecage.toml");
    write_config(&config, &["numpy", "openpyxl"], "");
    let s = start(&config, Options::default()).await;
    // A tier that preloads a module that raises when imported.
    let packages = raising_package(dir.path());
    let extra = format!(
        "\n[python]\nsite_packages = [{:?}]\n\n[[tiers.profile]]\nname = \"broken\"\npreload = [\"snakecage_boom\"]\n",
        packages.display().to_string()
    );
    write_config(&config, &["numpy", "snakecage_boom"], &extra);
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "rollover_failed", "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("preloading"), "{detail}");
    assert!(
        detail.contains("snakecage_boom: RuntimeError: snakecage_boom refuses to import"),
        "{detail}"
    );
    assert!(detail.contains("generation 1 keeps serving"), "{detail}");

    // Nothing switched: the same generation, the old allowlist, runs still served.
    assert_eq!(generation(&s).await, 1);
    assert!(allowed_packages(&s).await.contains(&"openpyxl".to_owned()));
    let r = s.run("import openpyxl\nprint('still')").await;
    assert_eq!(r["stdout"], "still\n", "{r}");
    let scrape = s.scrape().await;
    assert_rollovers(&scrape, 0, 1, 1);

    // A tier preloading a module that does not exist fails the same way.
    let extra =
        "\n[[tiers.profile]]\nname = \"missing\"\npreload = [\"no_such_module_anywhere\"]\n";
    write_config(&config, &["numpy"], extra);
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("No module named 'no_such_module_anywhere'"),
        "{body}"
    );
    assert_eq!(generation(&s).await, 1);

    // An interpreter prefix that does not exist: 422 naming it, nothing changes. The
    // configuration's check refuses it before a generation is started, so it is not a
    // failed rollover in the metrics.
    write_config(
        &config,
        &["numpy"],
        "\n[python]\nhome = \"/nonexistent-python-prefix\"\n",
    );
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains(
            "python.home \"/nonexistent-python-prefix\" does not exist: give a directory"
        ),
        "{body}"
    );
    assert_eq!(generation(&s).await, 1);

    // A configuration that does not parse: 422, nothing changes.
    std::fs::write(&config, "[sandbox]\nallowed_packages = 7\n").unwrap();
    let (status, body) = reload(&s, None).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("allowed_packages"),
        "{body}"
    );
    assert_eq!(generation(&s).await, 1);

    // Failed attempts leave no gap: the next generation that serves is 2.
    write_config(&config, &["numpy"], "");
    let (status, info) = reload(&s, None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], true, "{info}");
    assert_eq!(info["id"], 2, "{info}");
    assert_eq!(info["previous"], 1, "{info}");
    assert_eq!(generation(&s).await, 2);
    assert_rollovers(&s.scrape().await, 1, 2, 2);
    assert!(!allowed_packages(&s).await.contains(&"openpyxl".to_owned()));
}

/// A package directory holding `snakecage_boom`, whose import raises; readable by the
/// workers' unprivileged uid.
fn raising_package(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let root = dir.join("packages");
    let package = root.join("snakecage_boom");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(
        package.join("__init__.py"),
        "raise RuntimeError('snakecage_boom refuses to import')\n",
    )
    .unwrap();
    for path in [dir, &root, &package] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(
        package.join("__init__.py"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    root
}

/// The pool's own probe: a module that raises on import in a sandboxed worker fails it
/// with the traceback's text, and the pool keeps serving the generation it had.
#[tokio::test]
async fn a_probe_import_that_raises_fails_the_generation_with_its_traceback() {
    use snakecage::pool::RolloverStage;
    use snakecage_worker::protocol::Job;

    let dir = tempfile::tempdir().unwrap();
    let packages = raising_package(dir.path());
    let file = dir.path().join("snakecage.toml");
    write_config(&file, &["numpy"], "");
    let (pool, config, _) = start_pool(dir.path(), &file).await;

    let mut next = config.clone();
    next.python.site_packages.push(packages);
    next.sandbox.allowed_packages.push("snakecage_boom".into());
    let settings = snakecage::server::pool_settings(&next).unwrap();
    let imports = vec!["json".to_owned(), "snakecage_boom".to_owned()];
    let err = pool
        .prepare(settings.clone(), &imports, "test")
        .await
        .err()
        .unwrap();
    assert_eq!(err.stage, RolloverStage::Probe, "{err}");
    assert!(
        err.detail
            .contains("RuntimeError: snakecage_boom refuses to import"),
        "{err}"
    );
    assert_eq!(pool.generation(), 1);

    // Not on the allowlist: the import guard's own error.
    let mut unlisted = next.clone();
    unlisted
        .sandbox
        .allowed_packages
        .retain(|p| p != "snakecage_boom");
    let settings2 = snakecage::server::pool_settings(&unlisted).unwrap();
    let err = pool
        .prepare(settings2, &imports, "test")
        .await
        .err()
        .unwrap();
    assert!(
        err.detail
            .contains("import of 'snakecage_boom' is not allowed in this sandbox"),
        "{err}"
    );

    // The pool still serves generation 1, and a good generation switches.
    let job = Job {
        code: "print('still 1')".into(),
        stdin: None,
        last_line_interactive: false,
        entrypoint: None,
        args: Vec::new(),
        max_bundle_bytes: 0,
        timeout_ms: 0,
        tools: Vec::new(),
        max_concurrent_tool_calls: 1,
    };
    let limits = snakecage::pool::run::RunLimits {
        timeout: Duration::from_secs(30),
        max_output_bytes: 1 << 20,
        tools: None,
        cancel: None,
        background: None,
    };
    let outcome = pool.execute(job.clone(), &limits, None).await.unwrap();
    assert_eq!(outcome.stdout, "still 1\n");
    let good = snakecage::server::pool_settings(&config).unwrap();
    let prepared = pool
        .prepare(good, &["json".to_owned()], "test")
        .await
        .unwrap();
    let id = prepared.id();
    assert!(id > 1);
    pool.switch(prepared);
    assert_eq!(pool.generation(), id);
    let outcome = pool.execute(job, &limits, None).await.unwrap();
    assert_eq!(outcome.stdout, "still 1\n");
    pool.shutdown().await;
}
