//! The hostile suite against every layer, where the Python layer (audit hook, import
//! guard) meets most attacks first with a message naming what was denied; and the import
//! guard's promises: everything the allowlist names imports in a hardened worker, and the
//! user's own workspace modules never stand in for denied ones.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::fixture::{ALL_LAYERS, run_fixtures};
use super::host::{
    HostBait, assert_unharmed, plant_secrets_in_workspaces, worker_files_outside_workspaces,
    workspaces_size,
};
use super::{filesystem, python_layer_fixtures};
use crate::harness::{Options, Server, descendants_of};

/// `tiers.profile` with one tier preloading everything the default tiers preload.
const FULL_TIER_ONLY: &str = r#"[{name = "full", preload = ["numpy", "pandas", "matplotlib", "matplotlib.pyplot", "asyncio"]}]"#;

#[tokio::test]
async fn hostile_programs_are_stopped_by_the_python_layer_with_exact_messages() {
    let bait = HostBait::new();
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)
            .env("HOST_API_TOKEN", "supervisor-only")
            // One tier with everything preloaded: the gadgets below reach for modules
            // (subprocess, socket, signal) that only a full zygote has in memory, so every
            // fixture meets the most a worker can hold. A lighter tier holds a subset.
            .env("SNAKECAGE_TIERS__PROFILE", FULL_TIER_ONLY),
    )
    .await;
    let health = s.health().await;
    for layer in ["landlock", "seccomp", "audit_hook", "import_guard"] {
        assert_eq!(health["sandbox"][layer]["state"], "active", "{health}");
    }
    let zygote_pid = health["pool"]["zygote"]["pid"].as_i64().unwrap();

    let mut failures = run_fixtures(&s, python_layer_fixtures(&bait, zygote_pid)).await;

    // Another worker's workspace: plant a secret in every idle worker's directory, then
    // try to read each sibling's.
    s.wait_for_idle(2).await;
    let planted = plant_secrets_in_workspaces(s.state_dir());
    assert!(planted >= 1, "no idle workspace to plant a secret in");
    failures.extend(run_fixtures(&s, vec![filesystem::other_workspaces()]).await);
    assert!(
        failures.is_empty(),
        "{} fixture(s) escaped or were stopped differently:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The service is healthy, on the same zygote, and serves the next request.
    let after = assert_unharmed(&s, &json!(zygote_pid), &bait).await;
    assert_eq!(after["pool"]["zygote_restarts"], 0, "{after}");
    assert_eq!(s.run("print(6 * 7)").await["stdout"], "42\n");

    // The disk filler's files went with its workspace (what a run writes is also stored
    // in the file store, bounded by workspace.max_total_mb and files.quota_mb: not measured
    // here).
    let deadline = Instant::now() + Duration::from_secs(5);
    while workspaces_size(s.state_dir()) > 50 << 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        workspaces_size(s.state_dir()) <= 50 << 20,
        "workspaces were not cleaned up: {} bytes left",
        workspaces_size(s.state_dir())
    );

    // Nothing outside the workspaces changed.
    let roots = ["/tmp", "/var/tmp", "/dev/shm", "/etc", "/root"].map(PathBuf::from);
    let stray = worker_files_outside_workspaces(&roots);
    assert!(
        stray.is_empty(),
        "files owned by the worker uid outside any workspace: {stray:?}"
    );

    // No process it started is left behind.
    let below = descendants_of(s.pid());
    s.stop_leaving_no_process(below);
}

#[tokio::test]
async fn everything_the_allowlist_promises_works_inside_a_hardened_worker() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)).await;
    let names: Vec<String> = snakecage_worker::allowlist::stdlib_allowlist()
        .iter()
        .map(|m| format!("{:?}", m.name))
        .collect();
    let code = format!(
        "failed = []\nfor name in [{}]:\n    try:\n        __import__(name)\n    except Exception as e:\n        failed.append(f'{{name}}: {{e!r}}')\nprint(failed)",
        names.join(", ")
    );
    let r = s.run(&code).await;
    assert_eq!(r["stdout"], "[]\n", "{r}");

    // What a data-analysis job does: third-party packages, lazily loaded extension
    // modules (shared libraries from /usr/lib), time zones, temp files, a saved figure.
    let job = "import numpy as np, pandas as pd, scipy.stats, PIL.Image, openpyxl\nimport matplotlib.pyplot as plt\nimport sqlite3, lzma, bz2, zoneinfo, tempfile, datetime, copy, decimal, os\nplt.plot(np.arange(5))\nplt.savefig('fig.png')\ndb = sqlite3.connect(':memory:')\ndb.execute('create table t (x)')\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'x')\ndf = pd.DataFrame({'a': [1, 2]})\ndf.to_excel('t.xlsx')\nprint(os.path.getsize('fig.png') > 0, len(lzma.compress(b'x')) > 0, zoneinfo.ZoneInfo('Europe/Paris').key, datetime.datetime.strptime('2024', '%Y').year, copy.deepcopy({'k': [1]}), round(float(scipy.stats.norm.cdf(0)), 2), open(os.path.abspath('t.xlsx'), 'rb').read(2))";
    // scipy and openpyxl are not preloaded: importing them takes a while on a busy machine.
    let r = s.run_with(json!({"code": job, "timeout_ms": 30_000})).await;
    assert_eq!(
        r["stdout"], "True True Europe/Paris 2024 {'k': [1]} 0.5 b'PK'\n",
        "{r}"
    );
}

/// User code may import its own modules from the workspace, as `python __main__.py` can;
/// that must never become a way to reach a real module the allowlist denies.
#[tokio::test]
async fn own_workspace_modules_import_but_cannot_stand_in_for_denied_ones() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)).await;

    // A helper module written next to the code imports.
    let r = s.run("open('helper.py', 'w').write('def twice(x):\\n    return 2 * x\\n')\nimport helper\nprint(helper.twice(21))").await;
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(0), json!("42\n")),
        "{r}"
    );

    // A file named like a denied module is the user's file, or denied: never the real one.
    let r = s
        .run("open('subprocess.py', 'w').write('MARK = 1\\n')\nimport subprocess\nprint(hasattr(subprocess, 'MARK'), hasattr(subprocess, 'Popen'))")
        .await;
    let stdout = r["stdout"].as_str().unwrap();
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stdout == "True False\n"
            || stderr
                .contains("ImportError: import of 'subprocess' is not allowed in this sandbox"),
        "{r}"
    );
    assert!(
        !stdout.contains("True True") && !stdout.contains("False True"),
        "the real subprocess was reached: {r}"
    );

    // A namespace directory does not count: the finder would go on to the real module.
    let r = s.run("import os\nos.mkdir('socket')\nimport socket").await;
    assert_eq!(r["exit_code"], 1, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("ImportError: import of 'socket' is not allowed in this sandbox"),
        "{r}"
    );

    // A module outside the workspace on sys.path does not count either.
    let r = s
        .run("import sys\nsys.path.insert(0, '/usr/lib/python3/dist-packages')\nimport smtplib")
        .await;
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("ImportError: import of 'smtplib' is not allowed in this sandbox"),
        "{r}"
    );
}
