//! Package changes and reloads share the one rollover slot, and the request that came
//! first holds it: a package change takes it before its install, so a reload arriving
//! while the installer runs gets the 409, never the change after its install. The
//! install is held open by a fixture whose build waits for the test
//! (`tests/fixtures/slow-build-package`): no timing is involved.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{Options, Server, repo_root};
use crate::packages::{admin, managed};
use crate::packages_env::shared_uv_cache;

/// The slow-build fixture as an sdist in a find-links directory of its own; its build
/// creates `<gate>/started`, then waits for `<gate>/release`.
fn slow_build_package(scratch: &Path, gate: &Path) -> PathBuf {
    let fixture = repo_root().join("tests/fixtures/slow-build-package");
    let src = scratch.join("src");
    std::fs::create_dir_all(src.join("snakecage_slow_build")).unwrap();
    for file in [
        "pyproject.toml",
        "slow_build_backend.py",
        "snakecage_slow_build/__init__.py",
    ] {
        std::fs::copy(fixture.join(file), src.join(file)).unwrap();
    }
    std::fs::write(src.join("gate.txt"), gate.display().to_string()).unwrap();
    let out_dir = scratch.join("dist");
    let out = Command::new(repo_root().join(".venv-tools/bin/uv"))
        .args(["build", "--no-config", "--quiet", "--sdist", "--out-dir"])
        .arg(&out_dir)
        .arg(&src)
        .env("UV_CACHE_DIR", shared_uv_cache())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "uv build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out_dir
}

/// Releases the fixture's build when dropped (or now).
struct Release(PathBuf);

impl Release {
    fn now(&self) {
        std::fs::write(&self.0, "").unwrap();
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "");
    }
}

#[tokio::test]
async fn a_reload_during_a_package_install_gets_409_and_the_install_goes_through() {
    let scratch = tempfile::tempdir().unwrap();
    let gate = scratch.path().join("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let sdists = slow_build_package(scratch.path(), &gate);
    // However the test ends, the build is let go.
    let release = Release(gate.join("release"));
    let s = Server::start_with(managed(
        Options::default()
            .env(
                "SNAKECAGE_PACKAGES__FIND_LINKS",
                format!("[{:?}]", sdists.display().to_string()),
            )
            .env("SNAKECAGE_PACKAGES__BUILD_FROM_SOURCE", "true"),
    ))
    .await;
    let (_, list) = s.get_json("/v1/admin/packages").await;
    let before = list["generation"]["id"].as_u64().unwrap();

    let add = {
        let client = s.client.clone();
        let url = format!("{}/v1/admin/packages", s.base);
        tokio::spawn(async move {
            let resp = client
                .post(url)
                .json(&json!({ "add": ["snakecage-slow-build==1.0"] }))
                .timeout(Duration::from_secs(600))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        })
    };
    // The installer is building the package: the change is under way.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !gate.join("started").exists() {
        assert!(
            Instant::now() < deadline && !add.is_finished(),
            "the install ended, or never started building the fixture"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for path in ["/v1/admin/reload?force=true", "/v1/admin/reload"] {
        let (status, body) = admin(&s, reqwest::Method::POST, path, None, None).await;
        assert_eq!(status, 409, "{path}: {body}");
        assert_eq!(body["code"], "rollover_in_progress", "{body}");
        assert_eq!(
            body["detail"],
            "a rollover is already in progress (packages add snakecage-slow-build==1.0); retry when it has finished",
            "{body}"
        );
    }
    // A second package change is refused the same way.
    let (status, body) = admin(
        &s,
        reqwest::Method::POST,
        "/v1/admin/packages",
        None,
        Some(json!({ "add": ["tabulate==0.9.0"] })),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "rollover_in_progress", "{body}");

    // Let the build finish: the change that came first goes through.
    release.now();
    let (status, added) = add.await.unwrap();
    assert_eq!(status, 200, "{added}");
    assert_eq!(added["rolled_over"], true, "{added}");
    assert_eq!(
        added["generation"]["id"].as_u64(),
        Some(before + 1),
        "{added}"
    );
    let r = s
        .run("import snakecage_slow_build as m\nprint(m.GREETING)")
        .await;
    assert_eq!(r["stdout"], "grüezi\n", "{r}");
    // The slot is free again once the change has ended.
    let (status, reloaded) = admin(&s, reqwest::Method::POST, "/v1/admin/reload", None, None).await;
    assert_eq!(status, 200, "{reloaded}");
    assert_eq!(reloaded["id"].as_u64(), Some(before + 1), "{reloaded}");
}
