//! The instance's bound on its workspaces: a tmpfs of its own, with a size and an inode
//! count, mounted at the workspace root's `mount` directory. Without it every workspace
//! lives on the base directory's file system (by default /dev/shm, as large as RAM), and
//! one job or session could fill the host's memory. Mounting needs CAP_SYS_ADMIN in the
//! supervisor's mount namespace; where it is refused the directory stays a plain one and
//! the reason is reported (`/health`), never assumed.
//!
//! The mount is made in the supervisor's namespace before any zygote starts, so every
//! zygote's private namespace (a copy made when it starts) holds it too; workers reach
//! their workspace through a descriptor opened on it in any case. A supervisor that dies
//! without shutting down leaves its mount behind: the next instance on the same base
//! unmounts it when it removes that instance's root ([`super::root`]).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use serde::Serialize;

/// Name of the mount point inside an instance's workspace root.
pub const MOUNT_DIR: &str = "mount";

/// `/health` turns `degraded` once this share (in percent) of the workspace file system's
/// bytes or inodes is used: with 10% left a few more jobs writing at tmpfs speed fill it
/// within seconds, and staging is refused from then on.
pub const NEARLY_FULL_PERCENT: u64 = 90;

/// What the operator asked for (`[workspace]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundSettings {
    /// Whether to mount at all (`workspace.mount`).
    pub mount: bool,
    /// `size=` in bytes (`workspace.size_mb`); `None`: [`default_size`].
    pub size_bytes: Option<u64>,
    /// `nr_inodes=` (`workspace.max_inodes`); `None`: [`default_inodes`].
    pub inodes: Option<u64>,
}

/// Whether the workspaces are bounded, and if not why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// Our tmpfs is mounted with this size and inode count.
    Mounted { size_bytes: u64, inodes: u64 },
    /// A plain directory on the base file system; the reason.
    Unbounded(String),
    /// Mounted at start, and gone since (unmounted, or the root removed, under the
    /// service): the workspaces share the base file system until a restart; the reason.
    Lost(String),
}

/// The workspace file system as `/health` and the metrics report it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WorkspaceUsage {
    /// Whether the service's own bounded tmpfs holds the workspaces.
    pub bounded: bool,
    /// Why it does not, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unbounded_because: Option<String>,
    /// The tmpfs it had at start is gone (`/health` is degraded until a restart).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bound_lost: bool,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub inodes_used: u64,
    /// At least [`NEARLY_FULL_PERCENT`] of the bytes or of the inodes are used.
    pub nearly_full: bool,
}

/// A quarter of RAM, and never more than the base file system could hold (by default
/// /dev/shm, itself a share of RAM): the workers' own memory (`pool.size` processes, each
/// bounded by `limits.memory_mb`) and the host need the rest, and a bound larger than the
/// file system it replaces would bound nothing.
pub fn default_size(base: &Path) -> u64 {
    let host = HostRoom::of(base);
    (host.ram / 4).min(host.base)
}

/// What this host has for the workspaces' tmpfs, in bytes (`u64::MAX` where it cannot be
/// read): its RAM, where a tmpfs lives, and the size of the base file system it stands in
/// for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRoom {
    pub ram: u64,
    pub base: u64,
}

impl HostRoom {
    /// The host's, for the base directory `base` (or, while it does not exist yet, the
    /// nearest directory above it that does: it will be made there).
    pub fn of(base: &Path) -> Self {
        let existing = base.ancestors().find(|dir| dir.exists()).unwrap_or(base);
        Self {
            ram: nix::sys::sysinfo::sysinfo().map_or(u64::MAX, |info| info.ram_total()),
            base: nix::sys::statvfs::statvfs(existing).map_or(u64::MAX, |st| {
                st.blocks().saturating_mul(st.fragment_size())
            }),
        }
    }
}

/// Refuses a tmpfs size (`workspace.size_mb`, given explicitly) beyond what the host has:
/// above its RAM the bound bounds nothing (the host runs out of memory before the tmpfs
/// is full), and, as for [`default_size`], above the base file system it is larger than
/// what it replaces. The refusal says both numbers and what to set instead. Without the
/// mount (`workspace.mount = false`) the size is not used, and not checked.
pub fn check_size(settings: &BoundSettings, base: &Path, host: HostRoom) -> Result<(), String> {
    let Some(size) = settings.size_bytes.filter(|_| settings.mount) else {
        return Ok(());
    };
    let most = host.ram.min(host.base);
    if size <= most {
        return Ok(());
    }
    let mb = |bytes: u64| bytes >> 20;
    Err(format!(
        "workspace.size_mb is {} but this host has {} MB of RAM (the workspaces' tmpfs lives \
         in memory) and the file system of {} holds {} MB: set workspace.size_mb to at most \
         {}, or to 0 for the default (a quarter of RAM, at most that file system's size)",
        mb(size),
        mb(host.ram),
        base.display(),
        mb(host.base),
        mb(most)
    ))
}

/// One inode per 32 KiB of size: a tmpfs inode costs about 1 KiB of kernel memory that its
/// `size` does not count, so empty files alone could otherwise take gigabytes; 32 KiB
/// still allows hundreds of thousands of small files (a package tree, a dataset split into
/// parts) in a bound of some GiB.
pub fn default_inodes(size_bytes: u64) -> u64 {
    (size_bytes / (32 << 10)).max(1024)
}

/// Mounts a tmpfs at `dir` (an empty directory we own), with `dir`'s owner and mode, or
/// says why it stays a plain directory.
pub fn mount(dir: &Path, base: &Path, settings: &BoundSettings) -> Bound {
    if !settings.mount {
        return Bound::Unbounded("workspace.mount is false".into());
    }
    let size_bytes = settings.size_bytes.unwrap_or_else(|| default_size(base));
    let inodes = settings
        .inodes
        .unwrap_or_else(|| default_inodes(size_bytes));
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) => return Bound::Unbounded(format!("{}: {e}", dir.display())),
    };
    let options = format!(
        "size={size_bytes},nr_inodes={inodes},mode={:o},uid={},gid={}",
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid()
    );
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    match nix::mount::mount(
        Some("snakecage"),
        dir,
        Some("tmpfs"),
        flags,
        Some(options.as_str()),
    ) {
        Ok(()) => Bound::Mounted { size_bytes, inodes },
        Err(Errno::EPERM) => Bound::Unbounded(
            "the service may not mount a tmpfs here (no CAP_SYS_ADMIN in its mount namespace)"
                .into(),
        ),
        Err(e) => Bound::Unbounded(format!("mounting a tmpfs at {} failed: {e}", dir.display())),
    }
}

/// Whether `dir` is still a mount point: a file system other than its parent's (`root`).
pub fn is_mounted(dir: &Path, root: &Path) -> bool {
    match (std::fs::metadata(dir), std::fs::metadata(root)) {
        (Ok(dir), Ok(root)) => dir.dev() != root.dev(),
        _ => false,
    }
}

/// Detaches every mount stacked at `dir` (ours, or one a dead instance left); lazily, so
/// a process still inside (a zygote's namespace keeps its own copy anyway) does not stop
/// it. Returns whether there was one.
pub fn unmount(dir: &Path) -> io::Result<bool> {
    let mut any = false;
    // A bounded loop: mounts may be stacked, but never without end.
    for _ in 0..16 {
        if !is_mount_point(dir)? {
            return Ok(any);
        }
        nix::mount::umount2(dir, MntFlags::MNT_DETACH)?;
        any = true;
    }
    Err(io::Error::other(format!(
        "{} still has a mount after 16 unmounts",
        dir.display()
    )))
}

/// Whether `dir` is the root of a file system other than its parent's (a missing `dir`
/// is not).
fn is_mount_point(dir: &Path) -> io::Result<bool> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let parent = std::fs::metadata(dir.join(".."))?;
    Ok(meta.is_dir() && (meta.dev() != parent.dev() || meta.ino() == parent.ino()))
}

/// The usage of the file system at `dir` now (one `statvfs`).
pub fn usage(dir: &Path, bound: &Bound) -> io::Result<WorkspaceUsage> {
    let st = nix::sys::statvfs::statvfs(dir)?;
    let block = st.fragment_size() as u64;
    let size_bytes = st.blocks() as u64 * block;
    let used_bytes = (st.blocks() - st.blocks_free()) as u64 * block;
    let inodes = st.files() as u64;
    let inodes_used = inodes - st.files_free() as u64;
    let over = |used: u64, total: u64| total > 0 && used * 100 >= total * NEARLY_FULL_PERCENT;
    Ok(WorkspaceUsage {
        bounded: matches!(bound, Bound::Mounted { .. }),
        unbounded_because: match bound {
            Bound::Mounted { .. } => None,
            Bound::Unbounded(why) | Bound::Lost(why) => Some(why.clone()),
        },
        bound_lost: matches!(bound, Bound::Lost(_)),
        size_bytes,
        used_bytes,
        inodes,
        inodes_used,
        nearly_full: over(used_bytes, size_bytes) || over(inodes_used, inodes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_quarter_of_ram_at_most_the_base_and_inodes_follow_the_size() {
        let base = tempfile::tempdir().unwrap();
        let size = default_size(base.path());
        let ram = nix::sys::sysinfo::sysinfo().unwrap().ram_total();
        let st = nix::sys::statvfs::statvfs(base.path()).unwrap();
        let base_total = st.blocks() as u64 * st.fragment_size() as u64;
        assert_eq!(size, (ram / 4).min(base_total));
        assert_eq!(default_inodes(1 << 30), 32_768);
        assert_eq!(default_inodes(1 << 20), 1024);
    }

    #[test]
    fn an_explicit_size_beyond_the_hosts_ram_or_base_file_system_is_refused() {
        let host = HostRoom {
            ram: 8 << 30,
            base: 4 << 30,
        };
        let base = Path::new("/dev/shm/snakecage");
        let asked = |mb: u64, mount: bool| BoundSettings {
            mount,
            size_bytes: Some(mb << 20),
            inodes: None,
        };
        assert_eq!(check_size(&asked(4096, true), base, host), Ok(()));
        assert_eq!(
            check_size(&asked(4097, true), base, host),
            Err(
                "workspace.size_mb is 4097 but this host has 8192 MB of RAM (the workspaces' \
                 tmpfs lives in memory) and the file system of /dev/shm/snakecage holds 4096 \
                 MB: set workspace.size_mb to at most 4096, or to 0 for the default (a quarter \
                 of RAM, at most that file system's size)"
                    .to_owned()
            )
        );
        // The RAM bounds it too, where the base file system is larger (a disk).
        let disk = HostRoom {
            ram: 8 << 30,
            base: 1 << 40,
        };
        assert!(
            check_size(&asked(8193, true), base, disk)
                .unwrap_err()
                .contains("at most 8192,")
        );
        // Not mounted, or the default: nothing to refuse.
        assert_eq!(check_size(&asked(1 << 30, false), base, host), Ok(()));
        let default = BoundSettings {
            mount: true,
            size_bytes: None,
            inodes: None,
        };
        assert_eq!(check_size(&default, base, host), Ok(()));
    }

    #[test]
    fn a_plain_directory_is_no_mount_point_and_unmounting_it_is_a_no_op() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join(MOUNT_DIR);
        std::fs::create_dir(&dir).unwrap();
        assert!(!is_mount_point(&dir).unwrap());
        assert!(!unmount(&dir).unwrap());
        assert!(!unmount(&base.path().join("missing")).unwrap());
        let off = BoundSettings {
            mount: false,
            size_bytes: None,
            inodes: None,
        };
        assert_eq!(
            mount(&dir, base.path(), &off),
            Bound::Unbounded("workspace.mount is false".into())
        );
    }
}
