//! A tier with `snapshot = true`: its zygote's heap is mapped from memfds, its workers
//! inherit that mapping, run numpy, pandas and matplotlib correctly, keep their writes to
//! themselves, and meet every sandbox layer exactly as on any other tier.

use std::path::Path;

use crate::escapes::{ALL_LAYERS, HostBait, assert_os_layers_stop_every_escape, python_layer_off};
use crate::harness::{Options, Server, children_of};

/// One tier preloading what the default tiers preload, snapshotted.
const SNAPSHOT_TIER: &str = r#"[{name = "full", preload = ["numpy", "pandas", "matplotlib", "matplotlib.pyplot"], snapshot = true}]"#;

/// The snapshot's mappings of one process, from its smaps: (count, total KiB, KiB written
/// since the snapshot, i.e. private anonymous copies).
fn snapshot_mappings(pid: u32) -> (usize, u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut count, mut size, mut written) = (0, 0, 0);
    let mut in_snapshot = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            in_snapshot = line.contains("/memfd:snakecage-snapshot");
            count += usize::from(in_snapshot);
            continue;
        }
        if !in_snapshot {
            continue;
        }
        let mut kb = || fields.next().and_then(|v| v.parse::<u64>().ok()).unwrap();
        match first {
            "Size:" => size += kb(),
            "Anonymous:" => written += kb(),
            _ => {}
        }
    }
    (count, size, written)
}

fn zygote_pid(s_health: &serde_json::Value) -> u32 {
    s_health["pool"]["zygote"]["pid"].as_u64().unwrap() as u32
}

#[tokio::test]
async fn a_snapshotted_tier_forks_from_memfd_memory_and_its_workers_stay_correct_and_private() {
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)
            .env("SNAKECAGE_TIERS__PROFILE", SNAPSHOT_TIER),
    )
    .await;
    let health = s.health().await;
    for layer in ["landlock", "seccomp", "audit_hook", "import_guard"] {
        assert_eq!(health["sandbox"][layer]["state"], "active", "{health}");
    }
    let zygote = zygote_pid(&health);

    // The zygote's heap (numpy, pandas, matplotlib: well over 50 MiB) is the memfds'.
    let (count, size_kb, _) = snapshot_mappings(zygote);
    assert!(
        count >= 10 && size_kb >= 50 << 10,
        "{count} snapshot mappings, {size_kb} KiB"
    );
    // An idle worker maps it too (inherited at fork, not copied).
    s.wait_for_idle(1).await;
    let workers = children_of(zygote);
    assert!(!workers.is_empty());
    let (worker_count, _, _) = snapshot_mappings(workers[0]);
    assert!(worker_count >= count, "{worker_count} < {count}");

    // What the preloads are for still works, and a figure renders to PNG.
    let groupby = "import numpy as np, pandas as pd\ndf = pd.DataFrame({'k': np.arange(100) % 7, 'v': np.arange(100.0)})\nprint(df.groupby('k')['v'].sum().iloc[3])";
    assert_eq!(s.run(groupby).await["stdout"], "679.0\n");
    let figure = "import io\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3], [3, 1, 2])\nbuf = io.BytesIO()\nfig.savefig(buf, format='png')\nprint(buf.getvalue()[:4], len(buf.getvalue()) > 1000)";
    assert_eq!(
        s.run(figure).await["stdout"],
        "b'\\x89PNG' True\n",
        "{}",
        s.log()
    );

    // A worker writes into the snapshotted heap (a preloaded module's dict): the next worker sees the snapshot, not those writes.
    let r = s
        .run("import numpy as np\nnp.planted = 'é'\nprint(np.planted)")
        .await;
    assert_eq!(r["stdout"], "é\n", "{r}");
    let r = s
        .run("import numpy as np\nprint(hasattr(np, 'planted'))")
        .await;
    assert_eq!(r["stdout"], "False\n", "{r}");

    // After many forks the zygote has written only a sliver of its snapshot: its pages
    // are still the memfds' pages, shared with every worker, not private copies.
    for i in 0..30 {
        let r = s.run(&format!("print({i} * 2)")).await;
        assert_eq!(r["stdout"], format!("{}\n", i * 2));
    }
    let (count_after, size_after, written_kb) = snapshot_mappings(zygote);
    assert_eq!((count_after, size_after), (count, size_kb));
    assert!(
        written_kb * 20 < size_kb,
        "the zygote wrote {written_kb} KiB of its {size_kb} KiB snapshot"
    );
    let after = s.health().await;
    assert_eq!(zygote_pid(&after), zygote, "the zygote died");
    assert_eq!(after["pool"]["zygote_restarts"], 0, "{after}");
}

#[tokio::test]
async fn on_a_snapshotted_tier_the_os_layers_still_stop_every_escape() {
    let bait = HostBait::new();
    let s =
        Server::start_with(python_layer_off().env("SNAKECAGE_TIERS__PROFILE", SNAPSHOT_TIER)).await;
    let zygote = zygote_pid(&s.health().await);
    assert!(
        snapshot_mappings(zygote).0 > 0,
        "the tier is not snapshotted"
    );

    assert_os_layers_stop_every_escape(&s, &bait).await;
    // The snapshot's memfds are reachable only through /proc (map_files, maps): with the
    // Python layer off, the OS layers still deny both.
    for (code, denial) in [
        (
            "import os\nprint(os.listdir('/proc/self/map_files'))",
            "PermissionError: [Errno 13] Permission denied: '/proc/self/map_files'",
        ),
        (
            "print(open('/proc/self/maps').read())",
            "PermissionError: [Errno 13] Permission denied: '/proc/self/maps'",
        ),
    ] {
        let r = s.run(code).await;
        let stderr = r["stderr"].as_str().unwrap_or_default();
        assert_eq!(
            (r["exit_code"].as_i64(), stderr.trim_end().lines().last()),
            (Some(1), Some(denial)),
            "{r}"
        );
    }
    let after = s.health().await;
    assert_eq!(after["status"], "ok", "{after}");
    assert_eq!(zygote_pid(&after), zygote, "the zygote died");
    bait.assert_untouched();
    assert!(!Path::new("/tmp/snakecage-escape").exists());
}
