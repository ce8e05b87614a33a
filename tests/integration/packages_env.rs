//! Environment generations built for real (uv, the configured index), up to the rollover:
//! what a change leaves on disk, what it hands the rollover, what survives a restart, and
//! that a failed change leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use snakecage::config::Config;
use snakecage::envs::plan::Change;
use snakecage::envs::spec::Spec;
use snakecage::envs::{EnvError, EnvManager, Prepare, Prepared};

use crate::harness::repo_root;

/// A configuration on the repository's venv, with generations in `state_dir` and the
/// tests' shared uv cache (warm after the first test: environments are hard-linked).
pub fn env_config(state_dir: &Path) -> Config {
    let mut config = Config::default();
    config.python.venv = Some(repo_root().join(".venv"));
    config.worker.state_dir = state_dir.to_path_buf();
    config.packages.uv = repo_root().join(".venv-tools/bin/uv");
    config.packages.cache_dir = Some(shared_uv_cache());
    config
}

pub fn shared_uv_cache() -> PathBuf {
    repo_root().join("target/uv-cache-tests")
}

/// The environment directories below `state_dir`'s `envs`, sorted.
pub fn env_dirs(state_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(state_dir.join("envs")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("env-"))
        })
        .collect();
    dirs.sort();
    dirs
}

fn python_in(env: &Path, code: &str) -> (bool, String) {
    let out = Command::new(env.join("bin/python"))
        .args(["-c", code])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Builds the fixture package whose import raises (`tests/fixtures/crashing-package`) as a
/// wheel or an sdist (`--wheel`, `--sdist`) into a directory of its own, for find_links.
pub fn crashing_package(scratch: &Path, kind: &str) -> PathBuf {
    let src = scratch.join(format!("src{kind}"));
    let fixture = repo_root().join("tests/fixtures/crashing-package");
    std::fs::create_dir_all(src.join("snakecage_crash_probe")).unwrap();
    for file in ["pyproject.toml", "snakecage_crash_probe/__init__.py"] {
        std::fs::copy(fixture.join(file), src.join(file)).unwrap();
    }
    let out_dir = scratch.join(format!("dist{kind}"));
    let out = Command::new(repo_root().join(".venv-tools/bin/uv"))
        .args(["build", "--no-config", "--quiet", kind, "--out-dir"])
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

/// The environment a change built (it must have built one).
fn built(prepare: Prepare) -> Prepared {
    match prepare {
        Prepare::Built(prepared) => *prepared,
        Prepare::Unchanged(u) => panic!("nothing was built: {}", u.why),
    }
}

/// Why a change left the environment as it was (it must have).
fn unchanged(prepare: Prepare) -> snakecage::envs::Unchanged {
    match prepare {
        Prepare::Unchanged(u) => u,
        Prepare::Built(p) => panic!("a new environment was built: {}", p.dir.display()),
    }
}

fn add(spec: &str) -> Change {
    Change::Add {
        specs: vec![Spec::parse(spec).unwrap()],
        constraints: Vec::new(),
    }
}

#[tokio::test]
async fn an_add_builds_a_new_generation_beside_the_running_one_and_survives_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let mut config = env_config(state.path());
    let base_allowed = config.sandbox.allowed_packages.clone();
    let manager = EnvManager::open(&mut config).unwrap();
    assert_eq!(config.python.venv, Some(repo_root().join(".venv")));

    let guard = manager.begin().unwrap();
    // A second change while one runs is refused at once.
    assert!(matches!(manager.begin(), Err(EnvError::Busy)));
    let prepared = built(
        guard
            .prepare(&add("Tabulate==0.9.0"), &config)
            .await
            .unwrap(),
    );
    let dir = prepared.dir.clone();
    assert!(
        dir.starts_with(state.path().join("envs")),
        "{}",
        dir.display()
    );
    assert_eq!(prepared.config.python.venv.as_deref(), Some(dir.as_path()));
    assert_eq!(prepared.probe_imports, ["tabulate"]);
    assert!(
        prepared
            .config
            .sandbox
            .allowed_packages
            .contains(&"tabulate".to_owned())
    );
    assert!(
        base_allowed
            .iter()
            .all(|p| prepared.config.sandbox.allowed_packages.contains(p))
    );
    assert_eq!(prepared.changed[0].version, "0.9.0");
    // The new environment has the base's packages and the added one.
    let (ok, out) = python_in(
        &dir,
        "import pandas, tabulate; print(pandas.DataFrame({'ä': [1]}).to_markdown())",
    );
    assert!(ok && out.contains("|   ä |"), "{out}");
    // The running one is untouched.
    let (ok, out) = python_in(&repo_root().join(".venv"), "import tabulate");
    assert!(!ok && out.contains("No module named 'tabulate'"), "{out}");
    guard.commit(prepared).unwrap();
    assert_eq!(env_dirs(state.path()), std::slice::from_ref(&dir));

    // A restart: the managed environment replaces python.venv, the import name is allowed.
    drop(manager);
    let mut restarted = env_config(state.path());
    let manager = EnvManager::open(&mut restarted).unwrap();
    assert_eq!(restarted.python.venv.as_deref(), Some(dir.as_path()));
    assert!(
        restarted
            .sandbox
            .allowed_packages
            .contains(&"tabulate".to_owned())
    );
    let listing = manager.list(&restarted).unwrap();
    assert!(listing.managed);
    let tab = listing
        .distributions
        .iter()
        .find(|d| d.name == "tabulate")
        .unwrap();
    assert!(tab.added && tab.version == "0.9.0" && tab.import_names == ["tabulate"]);
    assert!(
        listing
            .distributions
            .iter()
            .any(|d| d.name == "pandas" && !d.added)
    );

    // The same requirement again: nothing to build, nothing runs.
    let guard = manager.begin().unwrap();
    let same = unchanged(
        guard
            .prepare(&add("tabulate==0.9.0"), &restarted)
            .await
            .unwrap(),
    );
    assert!(
        same.why.contains("already installed as requested"),
        "{}",
        same.why
    );
    assert_eq!(same.install_time, std::time::Duration::ZERO);
    guard.keep(same).unwrap();
    // Another text that resolves to the same distributions: the installer runs, its
    // directory goes, the new text is recorded, the environment stays.
    let resolved = unchanged(
        guard
            .prepare(&add("tabulate>=0.9,<0.10"), &restarted)
            .await
            .unwrap(),
    );
    assert!(resolved.why.contains("same versions"), "{}", resolved.why);
    assert!(resolved.install_time > std::time::Duration::ZERO);
    guard.keep(resolved).unwrap();
    assert_eq!(env_dirs(state.path()), std::slice::from_ref(&dir));
    let manifest = manager.manifest();
    let texts: Vec<&String> = manifest.requested.values().collect();
    assert!(
        texts.len() == 1 && texts[0].contains(">=0.9") && texts[0].contains("<0.10"),
        "{texts:?}"
    );
    assert_eq!(manifest.current_dir(manager.envs_dir()), Some(dir.clone()));
    // Removing what is installed nowhere: already gone.
    let gone = unchanged(
        guard
            .prepare(
                &Change::Remove {
                    names: vec!["snakecage-never-installed".into()],
                },
                &restarted,
            )
            .await
            .unwrap(),
    );
    assert!(
        gone.why
            .contains("snakecage-never-installed installed nowhere"),
        "{}",
        gone.why
    );
    drop(guard);

    // Remove it: the next generation lacks it and the allowlist loses it. A rollover that
    // fails (the prepared generation dropped uncommitted) leaves no directory behind.
    let guard = manager.begin().unwrap();
    let prepared = built(
        guard
            .prepare(
                &Change::Remove {
                    names: vec!["tabulate".into()],
                },
                &restarted,
            )
            .await
            .unwrap(),
    );
    let next = prepared.dir.clone();
    assert!(
        !prepared
            .config
            .sandbox
            .allowed_packages
            .contains(&"tabulate".to_owned())
    );
    let (ok, _) = python_in(&next, "import tabulate");
    assert!(!ok);
    let (ok, out) = python_in(&next, "import pandas");
    assert!(ok, "{out}");
    drop(prepared);
    assert!(!next.exists());
    assert_eq!(env_dirs(state.path()), std::slice::from_ref(&dir));
    // Removing what was never added names what was.
    let err = guard
        .prepare(
            &Change::Remove {
                names: vec!["numpy".into()],
            },
            &restarted,
        )
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("part of the base environment"),
        "{err}"
    );
    assert!(err.to_string().contains("added: tabulate"), "{err}");
}

#[tokio::test]
async fn a_spec_that_does_not_exist_fails_with_the_installers_words_and_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    let mut config = env_config(state.path());
    let manager = EnvManager::open(&mut config).unwrap();
    let guard = manager.begin().unwrap();
    let err = guard
        .prepare(&add("snakecage-no-such-package-zz==1.0"), &config)
        .await
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            EnvError::Uv(snakecage::envs::uv::UvError::Unresolvable(_))
        ),
        "{err:?}"
    );
    assert!(text.contains("snakecage-no-such-package-zz"), "{text}");
    assert!(env_dirs(state.path()).is_empty());
    assert_eq!(manager.manifest(), Default::default());
}

#[tokio::test]
async fn an_unreachable_index_is_told_apart_and_a_missing_uv_is_named() {
    let state = tempfile::tempdir().unwrap();
    let mut config = env_config(state.path());
    // Nothing listens on port 9 of loopback; a package the cache cannot know.
    config.packages.index_url = "http://127.0.0.1:9/simple".into();
    config.packages.cache_dir = Some(state.path().join("cold-cache"));
    let manager = EnvManager::open(&mut config).unwrap();
    let guard = manager.begin().unwrap();
    let err = guard
        .prepare(&add("snakecage-no-such-package-zz"), &config)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            EnvError::Uv(snakecage::envs::uv::UvError::IndexUnreachable(_))
        ),
        "{err:?}"
    );
    assert!(env_dirs(state.path()).is_empty());
    drop(guard);

    let mut config = env_config(state.path());
    config.packages.uv = state.path().join("no-uv-here");
    let manager = EnvManager::open(&mut config).unwrap();
    let err = manager.begin().err().unwrap();
    assert!(
        err.to_string().contains(&format!(
            "needs uv at {}",
            state.path().join("no-uv-here").display()
        )),
        "{err}"
    );
}

#[tokio::test]
async fn an_sdist_is_built_only_when_the_operator_allows_it() {
    let state = tempfile::tempdir().unwrap();
    let sdists = crashing_package(state.path(), "--sdist");
    let mut config = env_config(state.path());
    config.packages.find_links = vec![sdists];
    let manager = EnvManager::open(&mut config).unwrap();
    let guard = manager.begin().unwrap();
    let err = guard
        .prepare(&add("snakecage-crash-probe==1.0"), &config)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("has no usable wheels"), "{err}");
    assert!(env_dirs(state.path()).is_empty());
    drop(guard);

    // Allowed: the sdist is built (its build backend from the index) and installed.
    config.packages.build_from_source = true;
    let manager = EnvManager::open(&mut config).unwrap();
    let guard = manager.begin().unwrap();
    let prepared = built(
        guard
            .prepare(&add("snakecage-crash-probe==1.0"), &config)
            .await
            .unwrap(),
    );
    assert_eq!(prepared.probe_imports, ["snakecage_crash_probe"]);
    let (ok, out) = python_in(&prepared.dir, "import snakecage_crash_probe");
    assert!(!ok && out.contains("refuses to be imported"), "{out}");
}
