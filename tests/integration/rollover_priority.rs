//! A rollover is background work: the new generation's zygotes run at `SCHED_IDLE` from
//! their start (interpreter start-up and preloads yield to live requests), read from
//! `/proc/<pid>/stat` while one is still preloading; one still starting after the
//! rollover's patience (10 s) is raised to normal priority, so a busy host still switches.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::{Options, Server, children_of};
use crate::rollover::{reload_at, start, write_config, zygote_pids};
use crate::starting::slow_tier;

/// `SCHED_IDLE` in `sched_setscheduler(2)`.
const SCHED_IDLE: u64 = 5;

/// The command name and scheduling policy of `pid`, if it still runs.
fn comm_and_policy(pid: u32) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    // Fields from the third (state) on; `policy` is field 41.
    let policy = stat[close + 2..].split(' ').nth(41 - 3)?.parse().ok()?;
    Some((comm, policy))
}

/// Whether `pid` holds CAP_SYS_NICE (without it, nothing is put at idle priority).
fn has_cap_sys_nice(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap() & (1 << 23) != 0)
        .unwrap()
}

/// Forces a reload and, until it answers, samples the policy of every zygote the
/// supervisor starts (not in `old`): the samples, in order, and the reload's answer.
async fn watch_forced_reload(
    s: &Server,
    old: &BTreeSet<u32>,
) -> (Vec<(u32, u64)>, u16, serde_json::Value) {
    let supervisor = s.pid();
    let reload = reload_at(s, "/v1/admin/reload?force=true", None);
    tokio::pin!(reload);
    let mut seen: Vec<(u32, u64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (status, info) = loop {
        tokio::select! {
            answer = &mut reload => break answer,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        assert!(Instant::now() < deadline, "the reload never answered");
        for pid in children_of(supervisor) {
            if old.contains(&pid) {
                continue;
            }
            // After exec (before it, the child is still a copy of the supervisor).
            if let Some((comm, policy)) = comm_and_policy(pid)
                && comm.starts_with("snakecage-work")
            {
                seen.push((pid, policy));
            }
        }
    };
    (seen, status, info)
}

#[tokio::test]
async fn a_new_zygote_still_starting_after_the_patience_is_raised_to_normal_priority() {
    let dir = tempfile::tempdir().unwrap();
    // Its preload is quick at start-up, and takes 13 s once the flag file exists.
    let flag = dir.path().join("slow-now");
    let source = format!(
        "import os, time\nif os.path.exists({:?}):\n    time.sleep(13)\n",
        flag.display().to_string()
    );
    let extra = format!(
        "\n{}",
        slow_tier(dir.path(), "snakecage_slow_later", &source)
    );
    write_config(&dir.path().join("snakecage.toml"), &["numpy"], &extra);
    let s = start(&dir.path().join("snakecage.toml"), Options::default()).await;
    if !has_cap_sys_nice(s.pid()) {
        return; // nothing starts at idle priority, so nothing is raised
    }
    let old: BTreeSet<u32> = zygote_pids(&s)
        .await
        .into_iter()
        .map(|p| p as u32)
        .collect();
    std::fs::write(&flag, "").unwrap();
    let (seen, status, info) = watch_forced_reload(&s, &old).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], true, "{info}");
    // The slow tier's new zygote: idle first, then raised while it still preloaded (after
    // its Hello it lowers itself to idle again, as every zygote does).
    let slow = *zygote_pids(&s).await.last().unwrap() as u32;
    let policies: Vec<u64> = seen
        .iter()
        .filter(|(pid, _)| *pid == slow)
        .map(|(_, p)| *p)
        .collect();
    let first_raised = policies.iter().position(|p| *p == 0);
    assert_eq!(policies.first(), Some(&SCHED_IDLE), "{policies:?}");
    assert!(first_raised.is_some(), "never raised: {policies:?}");
    assert!(
        policies[..first_raised.unwrap()]
            .iter()
            .all(|p| *p == SCHED_IDLE),
        "{policies:?}"
    );
    assert!(s.log().contains("raised to normal"), "{}", s.log());
}

#[tokio::test]
async fn a_rollovers_new_zygotes_preload_at_idle_priority() {
    let dir = tempfile::tempdir().unwrap();
    // A tier whose preload takes seconds: the new zygote is seen while it starts.
    let tier = slow_tier(
        dir.path(),
        "snakecage_slow_import",
        "import time\ntime.sleep(3)\n",
    );
    let extra = format!("\n{tier}");
    write_config(&dir.path().join("snakecage.toml"), &["numpy"], &extra);
    let s = start(&dir.path().join("snakecage.toml"), Options::default()).await;
    let old: BTreeSet<u32> = zygote_pids(&s)
        .await
        .into_iter()
        .map(|p| p as u32)
        .collect();
    let supervisor = s.pid();
    let want = if has_cap_sys_nice(supervisor) {
        SCHED_IDLE
    } else {
        0
    };

    let (seen, status, info) = watch_forced_reload(&s, &old).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["rolled_over"], true, "{info}");
    let new: BTreeSet<u32> = zygote_pids(&s)
        .await
        .into_iter()
        .map(|p| p as u32)
        .collect();
    // Each tier's new zygote was seen while the reload ran, and only ever at idle priority.
    let seen_new: BTreeSet<u32> = seen.iter().map(|(pid, _)| *pid).collect();
    assert!(new.is_subset(&seen_new), "new {new:?}, seen {seen:?}");
    assert!(
        seen.iter().all(|(_, policy)| *policy == want),
        "want policy {want}: {seen:?}"
    );
    assert_eq!(s.run("print(1 + 1)").await["stdout"], "2\n");
}
