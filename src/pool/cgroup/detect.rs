//! Where this process's cgroup is, read from `/proc/self/cgroup` and
//! `/proc/self/mountinfo`: the directory of its cgroup in a v1 controller's hierarchy
//! (`pids`, `memory`), or in the v2 (unified) one, or why neither is reachable. Parsing
//! only, no I/O: the unit tests feed it the files of v1, hybrid, v2 and cgroup-less hosts.

use std::path::{Path, PathBuf};

/// The hierarchy the instance's cgroup is made in, at this process's own cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// cgroup v1: our cgroup's directory in the controller's hierarchy (a hybrid host, with
    /// v1 controllers and an empty v2 tree beside them, is v1 for this).
    V1 { dir: PathBuf },
    /// cgroup v2: our cgroup's directory in the unified hierarchy.
    V2 { dir: PathBuf },
    /// Neither: why.
    None(String),
}

/// One line of `/proc/self/cgroup`: `hierarchy-id:controllers:path`.
struct Membership<'a> {
    v2: bool,
    controllers: Vec<&'a str>,
    path: &'a str,
}

fn memberships(proc_cgroup: &str) -> Vec<Membership<'_>> {
    proc_cgroup
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            Some(Membership {
                v2: id == "0" && controllers.is_empty(),
                controllers: controllers.split(',').filter(|c| !c.is_empty()).collect(),
                path,
            })
        })
        .collect()
}

/// One cgroup mount of `/proc/self/mountinfo`.
struct Mount {
    /// The cgroup of the hierarchy shown at `point` (not `/` under a bind mount of a
    /// subtree).
    root: String,
    point: PathBuf,
    v2: bool,
    /// v1: the controllers of the hierarchy (from the super options).
    controllers: Vec<String>,
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let code =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cgroup_mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let root = unescape(fields.get(3)?);
            let point = PathBuf::from(unescape(fields.get(4)?));
            let mut after = after.split(' ');
            let fstype = after.next()?;
            let _source = after.next()?;
            let options = after.next().unwrap_or("");
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(Mount {
                root,
                point,
                v2,
                controllers: options.split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// `point` plus `path` relative to the mount's `root`, when `path` lies beneath it.
fn directory(mount: &Mount, path: &str) -> Option<PathBuf> {
    let relative = Path::new(path).strip_prefix(&mount.root).ok()?;
    Some(mount.point.join(relative))
}

/// Where this process's cgroup is for `controller` (`pids`, `memory`), from the texts of
/// `/proc/self/cgroup` and `/proc/self/mountinfo`: v1 first (a hybrid host's v2 tree has
/// no controllers), then v2.
pub fn find(controller: &str, proc_cgroup: &str, mountinfo: &str) -> Found {
    let memberships = memberships(proc_cgroup);
    let mounts = cgroup_mounts(mountinfo);
    if let Some(ours) = memberships
        .iter()
        .find(|m| !m.v2 && m.controllers.contains(&controller))
    {
        let mounted = mounts
            .iter()
            .filter(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
            .find_map(|m| directory(m, ours.path));
        return match mounted {
            Some(dir) => Found::V1 { dir },
            None => Found::None(format!(
                "cgroup v1: our {controller} cgroup {} is not visible in any mount of the {controller} hierarchy",
                ours.path
            )),
        };
    }
    if let Some(ours) = memberships.iter().find(|m| m.v2) {
        let mounted = mounts
            .iter()
            .filter(|m| m.v2)
            .find_map(|m| directory(m, ours.path));
        return match mounted {
            Some(dir) => Found::V2 { dir },
            None => Found::None(format!(
                "cgroup v2: our cgroup {} is not visible in any cgroup2 mount",
                ours.path
            )),
        };
    }
    Found::None(format!(
        "no cgroup v1 {controller} hierarchy and no cgroup v2 membership in /proc/self/cgroup"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/6f60\n0::/\n";
    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_hybrid_host_is_v1_at_our_cgroup_of_each_controller() {
        assert_eq!(
            find("pids", HYBRID_CGROUP, HYBRID_MOUNTS),
            Found::V1 {
                dir: "/sys/fs/cgroup/pids".into()
            }
        );
        // Each controller at our cgroup in its own hierarchy.
        assert_eq!(
            find("memory", HYBRID_CGROUP, HYBRID_MOUNTS),
            Found::V1 {
                dir: "/sys/fs/cgroup/memory/process_api/6f60".into()
            }
        );
        let nested = "8:blkio,pids:/user.slice/session-4.scope\n0::/user.slice\n";
        assert_eq!(
            find("pids", nested, HYBRID_MOUNTS),
            Found::V1 {
                dir: "/sys/fs/cgroup/pids/user.slice/session-4.scope".into()
            }
        );
    }

    #[test]
    fn a_v2_host_and_a_container_with_its_own_subtree_mounted() {
        let mounts = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            find("pids", "0::/system.slice/snakecage.service\n", mounts),
            Found::V2 {
                dir: "/sys/fs/cgroup/system.slice/snakecage.service".into()
            }
        );
        // A container without a cgroup namespace: the pod's subtree bind-mounted at
        // /sys/fs/cgroup, /proc/self/cgroup naming the host's path.
        let pod = "1290 1281 0:26 /kubepods/burstable/pod1/c2 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n";
        assert_eq!(
            find("pids", "0::/kubepods/burstable/pod1/c2\n", pod),
            Found::V2 {
                dir: "/sys/fs/cgroup".into()
            }
        );
        // A mount point with a space in it.
        let spaced = "29 23 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find("pids", "0::/a\n", spaced),
            Found::V2 {
                dir: "/mnt/cg two/a".into()
            }
        );
    }

    #[test]
    fn no_cgroup_or_one_out_of_sight_says_why() {
        let Found::None(why) = find("pids", "", "") else {
            panic!("nothing to find")
        };
        assert!(why.contains("no cgroup v1 pids hierarchy"), "{why}");
        // Our cgroup lies outside the mounted subtree.
        let pod = "1290 1281 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup rw\n";
        let Found::None(why) = find("pids", "0::/elsewhere\n", pod) else {
            panic!("not reachable")
        };
        assert!(why.contains("/elsewhere is not visible"), "{why}");
        // A v1 pids membership without its mount.
        let Found::None(why) = find("pids", "8:pids:/x\n", "") else {
            panic!("not mounted")
        };
        assert!(why.contains("pids cgroup /x"), "{why}");
    }
}
