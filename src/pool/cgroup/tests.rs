use super::*;

/// A fake instance's lock directory with a record of `cgroups`, its lock held or not.
fn instance(lock_dir: &Path, name: &str, cgroups: &[&Path], live: bool) -> Option<DirLock> {
    let dir = lock_dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let record: String = cgroups
        .iter()
        .map(|c| format!("{}\n", c.display()))
        .collect();
    std::fs::write(dir.join(RECORD), record).unwrap();
    let Lock::Taken(lock) = DirLock::lock(&dir).unwrap() else {
        panic!("free")
    };
    live.then_some(lock)
}

#[test]
fn a_dead_instances_cgroups_go_and_a_live_ones_stay() {
    let locks = tempfile::tempdir().unwrap();
    let tree = tempfile::tempdir().unwrap();
    // Empty directories stand in for cgroups (a cgroup's control files do not count
    // against rmdir; a plain directory's files would).
    let dead = tree.path().join("snakecage-11");
    let live = tree.path().join("snakecage-12");
    let unrecorded = tree.path().join("snakecage-13");
    for d in [&dead, &live, &unrecorded] {
        std::fs::create_dir(d).unwrap();
    }
    let gone = instance(locks.path(), "snakecage-11", &[&dead], false);
    assert!(gone.is_none());
    let _alive = instance(locks.path(), "snakecage-12", &[&live], true);
    // A lock directory without a lock file is nobody's to judge.
    std::fs::create_dir(locks.path().join("snakecage-14")).unwrap();
    std::fs::write(
        locks.path().join("snakecage-14").join(RECORD),
        format!("{}\n", unrecorded.display()),
    )
    .unwrap();

    remove_abandoned(locks.path());
    assert!(!dead.exists(), "the dead instance's cgroup is removed");
    assert!(
        !locks.path().join("snakecage-11").exists(),
        "and its record"
    );
    assert!(live.exists(), "a live instance's cgroup stays");
    assert!(locks.path().join("snakecage-12").join(RECORD).exists());
    assert!(
        unrecorded.exists(),
        "a cgroup without a lock file is not judged"
    );
}

#[test]
fn names_held_by_live_instances_are_skipped() {
    let locks = tempfile::tempdir().unwrap();
    let (first, _a) = claim_name(locks.path(), |_| false).unwrap();
    let (second, _b) = claim_name(locks.path(), |_| false).unwrap();
    let pid = std::process::id();
    assert_eq!(first, format!("snakecage-{pid}"));
    assert_eq!(second, format!("snakecage-{pid}-1"));
    // A cgroup of a free name that exists already (made by an instance that locks its
    // names elsewhere) is skipped, never shared.
    let third = format!("snakecage-{pid}-2");
    let (name, _c) = claim_name(locks.path(), |name| name == third).unwrap();
    assert_eq!(name, format!("snakecage-{pid}-3"));
}

#[test]
fn switched_off_makes_nothing() {
    let locks = tempfile::tempdir().unwrap();
    let settings = CgroupSettings {
        wanted: false,
        max_processes: 100,
        memory: MemoryBound::Off,
        lock_dir: locks.path().join("cgroups"),
    };
    let (cgroup, plan) = set_up(&settings, &Place::here());
    assert!(cgroup.is_none());
    let CgroupPlan::Unavailable(why) = plan else {
        panic!("{plan:?}")
    };
    assert!(
        why.starts_with("switched off by sandbox.layers_off"),
        "{why}"
    );
    assert!(!settings.lock_dir.exists());
}

#[test]
fn no_hierarchy_is_unavailable_with_why() {
    let locks = tempfile::tempdir().unwrap();
    let settings = CgroupSettings {
        wanted: true,
        max_processes: 100,
        memory: MemoryBound::Off,
        lock_dir: locks.path().to_path_buf(),
    };
    let place = Place {
        found: Found::None("no cgroup here".into()),
        memory: Found::None("no cgroup here".into()),
    };
    let (cgroup, plan) = set_up(&settings, &place);
    assert!(cgroup.is_none());
    assert_eq!(plan, CgroupPlan::Unavailable("no cgroup here".into()));
    // A v2 parent that does not hand pids down.
    let parent = tempfile::tempdir().unwrap();
    std::fs::write(parent.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
    let place = Place {
        found: Found::V2 {
            dir: parent.path().to_path_buf(),
        },
        memory: Found::V2 {
            dir: parent.path().to_path_buf(),
        },
    };
    let (_, plan) = set_up(&settings, &place);
    let CgroupPlan::Unavailable(why) = plan else {
        panic!("{plan:?}")
    };
    assert!(
        why.contains("the pids controller is not delegated"),
        "{why}"
    );
}

#[test]
fn an_instance_that_cannot_make_its_cgroup_leaves_a_dead_ones_to_the_next_start() {
    let locks = tempfile::tempdir().unwrap();
    let tree = tempfile::tempdir().unwrap();
    let dead = tree.path().join("snakecage-21");
    std::fs::create_dir(&dead).unwrap();
    assert!(instance(locks.path(), "snakecage-21", &[&dead], false).is_none());
    let settings = CgroupSettings {
        wanted: true,
        max_processes: 100,
        memory: MemoryBound::Off,
        lock_dir: locks.path().to_path_buf(),
    };
    // Where it cannot make its own (here: the hierarchy is not there; on a host, mounted
    // read-only), it does not touch the dead instance's: no lock of it is held after,
    // and it is all still there.
    let nowhere = Place {
        found: Found::V1 {
            dir: tree.path().join("not-mounted"),
        },
        memory: Found::None("no memory cgroup here".into()),
    };
    let (cgroup, plan) = set_up(&settings, &nowhere);
    assert!(cgroup.is_none(), "{plan:?}");
    assert!(dead.is_dir());
    let record = locks.path().join("snakecage-21");
    assert!(record.join(RECORD).exists());
    assert!(matches!(
        DirLock::lock_existing(&record).unwrap(),
        Lock::Taken(_)
    ));
    // The next start that makes its own removes it.
    let here = Place {
        found: Found::V1 {
            dir: tree.path().to_path_buf(),
        },
        memory: Found::None("no memory cgroup here".into()),
    };
    let (cgroup, _) = set_up(&settings, &here);
    let mut cgroup = cgroup.expect("made in the fake tree");
    assert!(!dead.exists(), "removed by the start that made its own");
    assert!(!record.exists());
    // Its own is a plain directory here: its pids.max file would keep rmdir from it.
    for dir in cgroup.dirs() {
        std::fs::remove_file(dir.join("pids.max")).unwrap();
    }
    cgroup.remove();
}
