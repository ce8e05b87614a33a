//! Zygote tiers: a job runs on the lightest tier whose preloads cover its imports, any code
//! runs correctly on any tier, and each tier shows in `/health` and `/metrics`.

use serde_json::{Value, json};
use snakecage::metrics::names;

use crate::harness::{Options, Server};
use crate::prom::promtool_check;

const TIERS: [&str; 4] = ["bare", "async", "scientific", "plotting"];

/// Waits until every tier has at least one idle worker, so the next job is served by the
/// tier it is routed to rather than by a fuller one.
async fn wait_for_every_tier(s: &Server) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let health = s.health().await;
        let tiers = health["pool"]["tiers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if tiers.len() == TIERS.len() && tiers.iter().all(|t| t["idle"].as_u64() >= Some(1)) {
            return health;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every tier got an idle worker: {health}\n{}",
            s.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Runs `code` once every tier is stocked; returns the response and the tier that served
/// it (from the checkout counters, which it moved by exactly one).
async fn run_on_some_tier(s: &Server, code: &str) -> (Value, String, String) {
    wait_for_every_tier(s).await;
    let before = s.scrape().await;
    let r = s
        .run_with(json!({ "code": code, "timeout_ms": 60_000 }))
        .await;
    let after = s.scrape().await;
    let mut moved = Vec::new();
    for (labels, value) in after.series(names::TIER_CHECKOUTS_TOTAL) {
        let pairs: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let was = before.get_or_zero(names::TIER_CHECKOUTS_TOTAL, &pairs);
        if value != was {
            moved.push((
                labels["tier"].clone(),
                labels["routed"].clone(),
                value - was,
            ));
        }
    }
    assert_eq!(moved.len(), 1, "one checkout should have moved: {moved:?}");
    let (tier, routed, n) = moved.remove(0);
    assert_eq!(n, 1.0);
    (r, tier, routed)
}

#[tokio::test]
async fn a_job_runs_on_the_lightest_tier_its_imports_need() {
    let s = Server::start().await;

    let (r, tier, routed) =
        run_on_some_tier(&s, "import json, re\nprint(json.dumps({'ü': 1+1}))").await;
    assert_eq!(r["stdout"], "{\"\\u00fc\": 2}\n", "{r}");
    assert_eq!((tier.as_str(), routed.as_str()), ("bare", "bare"));

    let code = "import numpy as np\ndef f():\n    import pandas as pd  # nested, still seen\n    \
                df = pd.DataFrame({'k': np.arange(100) % 7, 'v': np.arange(100.0)})\n    \
                return df.groupby('k')['v'].sum().iloc[3]\nprint(f())";
    let (r, tier, routed) = run_on_some_tier(&s, code).await;
    assert_eq!(r["stdout"], "679.0\n", "{r}");
    assert_eq!(
        (tier.as_str(), routed.as_str()),
        ("scientific", "scientific")
    );

    let code = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3], [1, 4, 9])\nax.set_title('ünïcode')";
    let (r, tier, routed) = run_on_some_tier(&s, code).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let bundles = r["results"].as_array().unwrap();
    let png = bundles.iter().find_map(|b| b["image/png"].as_str());
    assert!(
        png.is_some_and(|p| p.starts_with("iVBORw0KGgo")),
        "a PNG figure: {r}"
    );
    assert_eq!(bundles[0]["text/plain"], "Text(0.5, 1.0, 'ünïcode')");
    assert_eq!((tier.as_str(), routed.as_str()), ("plotting", "plotting"));

    // async and await need asyncio's loop: the light tier that preloads it, or with
    // pandas the scientific one, which preloads it too.
    let code = "async def double(x):\n    return 2 * x\nprint(await double(21), 'é')";
    let (r, tier, routed) = run_on_some_tier(&s, code).await;
    assert_eq!(r["stdout"], "42 é\n", "{r}");
    assert_eq!((tier.as_str(), routed.as_str()), ("async", "async"));
    let code =
        "import asyncio, pandas as pd\nawait asyncio.sleep(0)\nprint(pd.Series([1, 2]).sum())";
    let (r, tier, routed) = run_on_some_tier(&s, code).await;
    assert_eq!(r["stdout"], "3\n", "{r}");
    assert_eq!(
        (tier.as_str(), routed.as_str()),
        ("scientific", "scientific")
    );

    // Imports inside strings and comments do not count.
    let code = "s = '''\nimport pandas\n'''  # import matplotlib\nprint(len(s))";
    let (r, tier, _) = run_on_some_tier(&s, code).await;
    assert_eq!(r["stdout"], "15\n", "{r}");
    assert_eq!(tier, "bare");
}

#[tokio::test]
async fn imports_the_scan_cannot_read_still_work() {
    let s = Server::start().await;
    // Noticed but not readable: the fullest tier.
    let code = "pd = __import__('pandas')\nprint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())";
    let (r, tier, routed) = run_on_some_tier(&s, code).await;
    assert_eq!(r["stdout"], "6\n", "{r}");
    assert_eq!((tier.as_str(), routed.as_str()), ("plotting", "plotting"));

    // Not even noticed: it runs on the bare tier, which imports numpy and pandas then.
    let code = "imp = getattr(__builtins__, '__imp' + 'ort__')\npd = imp('pandas')\n\
                print(pd.Series([1.5, 2.5]).sum(), imp('numpy').arange(4).sum())";
    let (r, tier, routed) = run_on_some_tier(&s, code).await;
    assert_eq!(r["stdout"], "4.0 6\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!((tier.as_str(), routed.as_str()), ("bare", "bare"));

    // pandas draws with matplotlib, imported on first use: such code goes to plotting.
    let code = "import pandas as pd\npd.DataFrame({'a': [3, 1, 2]}).plot(kind='bar')";
    let (r, tier, _) = run_on_some_tier(&s, code).await;
    assert_eq!(tier, "plotting");
    assert_eq!(r["exit_code"], 0, "{r}");
    let bundles = r["results"].as_array().unwrap();
    assert!(bundles.iter().any(|b| b["image/png"].is_string()), "{r}");
}

#[tokio::test]
async fn a_routed_tier_without_idle_workers_is_served_by_a_fuller_one() {
    // No floor and a pool of one: with the demand split evenly at start, `bare` may have
    // no idle worker; whatever the split, every job is answered and right.
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_POOL__SIZE", 1)
            .env("SNAKECAGE_TIERS__MIN_IDLE", 0),
    )
    .await;
    let mut handles = Vec::new();
    for i in 0..6 {
        let code = if i % 2 == 0 {
            format!("print({i} * 2)")
        } else {
            format!("import pandas as pd\nprint(pd.Series([{i}, {i}]).sum())")
        };
        handles.push((
            i,
            s.spawn_execute(json!({ "code": code, "timeout_ms": 60_000 })),
        ));
    }
    for (i, handle) in handles {
        let r = handle.await.unwrap();
        assert_eq!(r["stdout"], format!("{}\n", i * 2), "job {i}: {r}");
    }
    let scrape = s.scrape().await;
    let served: f64 = scrape.sum(names::TIER_CHECKOUTS_TOTAL, &[]);
    assert_eq!(served, 6.0);
    // A pandas job is never served by the bare tier, which cannot cover it.
    assert_eq!(
        scrape.get(
            names::TIER_CHECKOUTS_TOTAL,
            &[("tier", "bare"), ("routed", "scientific")]
        ),
        0.0
    );
}

#[tokio::test]
async fn health_and_metrics_show_every_tier() {
    let s = Server::start().await;
    let health = wait_for_every_tier(&s).await;
    let tiers = health["pool"]["tiers"].as_array().unwrap();
    let names_seen: Vec<&str> = tiers.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names_seen, TIERS);
    assert_eq!(tiers[0]["preload"], json!([]));
    assert_eq!(tiers[1]["preload"], json!(["asyncio"]));
    assert_eq!(tiers[2]["preload"], json!(["numpy", "pandas", "asyncio"]));
    let pids: Vec<i64> = tiers
        .iter()
        .map(|t| t["zygote"]["pid"].as_i64().unwrap())
        .collect();
    assert!(
        pids[0] != pids[1] && pids[1] != pids[2] && pids[2] != pids[3],
        "one zygote per tier: {pids:?}"
    );
    assert!(tiers.iter().all(|t| t["zygote"]["alive"] == true));
    let idle: u64 = tiers.iter().map(|t| t["idle"].as_u64().unwrap()).sum();
    assert_eq!(health["pool"]["idle"].as_u64(), Some(idle));

    s.run("print('hi')").await;
    let scrape = s.scrape().await;
    promtool_check(&scrape.text);
    for tier in TIERS {
        let target = scrape.get(names::TIER_TARGET_IDLE_WORKERS, &[("tier", tier)]);
        assert!(target >= 1.0, "{tier}: the floor is one idle worker");
        scrape.get(names::TIER_IDLE_WORKERS, &[("tier", tier)]);
        scrape.get(names::TIER_SPAWNING_WORKERS, &[("tier", tier)]);
        for routed in TIERS {
            scrape.get(
                names::TIER_CHECKOUTS_TOTAL,
                &[("tier", tier), ("routed", routed)],
            );
        }
    }
    // Only configured tier names ever appear as labels.
    for (labels, _) in scrape.series(names::TIER_IDLE_WORKERS) {
        assert!(TIERS.contains(&labels["tier"].as_str()), "{labels:?}");
    }
    let status = s.get("/v1/status").await;
    assert_eq!(status.0, 200);
    let status: Value = serde_json::from_str(&status.2).unwrap();
    assert_eq!(
        status["pool"]["tiers"].as_array().map(Vec::len),
        Some(TIERS.len()),
        "{status}"
    );
}

#[tokio::test]
async fn a_bad_tier_configuration_stops_start_up_with_what_to_fix() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .env("SNAKECAGE_TIERS__SESSION", "gpu")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tiers.session names \"gpu\", which is not a tier"),
        "{stderr}"
    );
}

/// matplotlib imported where no scan can see it runs on a tier that did not preload it:
/// it must still import (its config dir passes matplotlib's writability check, so it
/// never falls back to exporting a temporary one, which the audit hook denies) and draw.
#[tokio::test]
async fn matplotlib_imported_behind_the_scan_still_draws_on_a_lighter_tier() {
    let s = Server::start().await;

    let code = "imp = getattr(__builtins__, '__imp' + 'ort__')\n\
                plt = imp('matplotlib.pyplot', fromlist=['figure'])\n\
                fig, ax = plt.subplots()\nax.bar([1, 2, 3], [1, 4, 9])  # no .plot( for the scan to see\nax.set_title('ünï')\n\
                print(plt.get_backend())";
    let (r, tier, _) = run_on_some_tier(&s, code).await;
    assert_eq!(tier, "bare");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "Agg\n", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    let bundles = r["results"].as_array().unwrap();
    assert!(bundles.iter().any(|b| b["image/png"].is_string()), "{r}");

    let code = "import pandas as pd\ndf = pd.DataFrame({'a': [3, 1, 2]})\n\
                getattr(df, 'pl' + 'ot')(kind='bar')";
    let (r, tier, _) = run_on_some_tier(&s, code).await;
    assert_eq!(tier, "scientific");
    assert_eq!(r["exit_code"], 0, "{r}");
    let bundles = r["results"].as_array().unwrap();
    assert!(bundles.iter().any(|b| b["image/png"].is_string()), "{r}");

    // The shared config dir stays read-only to workers.
    let code = "import os\ntry:\n    open(os.environ['MPLCONFIGDIR'] + '/matplotlibrc', 'w')\n\
                except PermissionError as e:\n    print(str(e).split(':')[0])";
    let r = s.run(code).await;
    assert_eq!(
        r["stdout"], "'open' for writing outside the workspace is not allowed in this sandbox\n",
        "{r}"
    );
}

/// `/ready` says 200 once a tier serves (a job routed to a tier still starting runs on
/// it: `partial_start`), and only once one does: when it does, some tier has had a
/// worker, and every other tier is serving or starting, not failed.
#[tokio::test]
async fn ready_once_a_tier_serves() {
    let s = Server::start_with(Options::default().first_worker_only()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, _, body) = s.get("/ready").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("no tier has a worker ready yet"), "{body}");
        assert!(std::time::Instant::now() < deadline, "never ready: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let health = s.health().await;
    let tiers = health["pool"]["tiers"].as_array().unwrap();
    assert!(
        tiers
            .iter()
            .any(|t| t["state"] == "serving" && t["workers_spawned"].as_u64() >= Some(1)),
        "{health}"
    );
    for tier in tiers {
        assert!(
            tier["state"] == "serving" || tier["state"] == "starting",
            "{health}"
        );
    }
}

#[tokio::test]
async fn the_lightest_tier_holds_only_its_runner_yet_the_package_list_is_complete() {
    let s = Server::start().await;
    // The package scan imports `importlib.metadata`, which brings `email`, `zipfile`,
    // `tempfile`, `threading`, `random`… It runs in a throwaway child: in the zygote, every
    // worker would copy those modules' pages and run `threading`'s and `random`'s at-fork
    // hooks, for jobs that never asked for them.
    let code = "import sys\nprint([m for m in ('importlib.metadata', 'email', 'zipfile', \
                'tempfile', 'threading', 'random') if m in sys.modules])";
    let (r, tier, _) = run_on_some_tier(&s, code).await;
    assert_eq!(tier, "bare");
    assert_eq!(r["stdout"], "[]\n", "{r}");

    // They still import there when a job asks, and each worker's `random` is its own.
    let code = "import random, threading, zipfile\nprint(threading.active_count(), random.getrandbits(64))";
    let (first, tier, _) = run_on_some_tier(&s, code).await;
    assert_eq!(tier, "bare");
    let (second, _, _) = run_on_some_tier(&s, code).await;
    let (a, b) = (
        first["stdout"].as_str().unwrap(),
        second["stdout"].as_str().unwrap(),
    );
    assert!(
        a.starts_with("1 ") && b.starts_with("1 "),
        "{first} {second}"
    );
    assert_ne!(a, b, "two workers drew the same random numbers");

    // The scan still found every allowed package with the version its metadata gives.
    let (status, packages) = s.get_json("/v1/packages").await;
    assert_eq!(status, 200, "{packages}");
    let listed = |name: &str| {
        packages["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is not listed: {packages}"))
    };
    let (r, _, _) = run_on_some_tier(
        &s,
        "import numpy, pandas\nprint(numpy.__version__, pandas.__version__)",
    )
    .await;
    let stdout = r["stdout"].as_str().unwrap().trim().to_owned();
    let (numpy, pandas) = stdout.split_once(' ').unwrap();
    assert_eq!(listed("numpy")["version"], numpy, "{packages}");
    assert_eq!(listed("pandas")["version"], pandas, "{packages}");
    assert_eq!(listed("numpy")["installed"], true);
}
