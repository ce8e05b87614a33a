//! Landlock: what a worker may touch on the filesystem and beyond it.
//!
//! - read (and map for execution): the Python prefix, the configured site-packages, the
//!   shared libraries extension modules link against, time zones, a few device nodes;
//! - read-write: beneath its own workspace directory (fd 4), nothing else; in particular
//!   not another worker's workspace (another uid's, as each worker has its own);
//! - no TCP bind or connect (ABI 4), no connecting to abstract Unix sockets and no signals
//!   to processes outside its own domain (ABI 6 scopes): not the zygote, not the supervisor,
//!   not another worker.
//!
//! Best effort against the running kernel's ABI; the start-up probe reports how much was
//! enforced and whether a denial really happens.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The newest ABI this policy knows how to use.
const TARGET_ABI: ABI = ABI::V6;

/// System paths (besides the Python prefix and site-packages) a worker may read. Missing
/// ones are skipped.
const SYSTEM_READ_ONLY: &[&str] = &[
    "/usr/lib",
    "/usr/lib64",
    "/lib",
    "/lib64",
    "/etc/ld.so.cache",
    "/usr/share/zoneinfo",
    "/etc/localtime",
    "/etc/mime.types", // mimetypes (matplotlib's savefig) reads it
    "/etc/apache2/mime.types",
    "/etc/httpd/mime.types",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
];

/// The read-only paths for a zygote configured with `python_home`, `site_packages` and
/// `extra` (e.g. matplotlib's config directory).
pub fn read_only_paths(
    python_home: &Path,
    site_packages: &[PathBuf],
    extra: &[PathBuf],
) -> Vec<PathBuf> {
    let mut paths = vec![python_home.to_path_buf()];
    paths.extend(site_packages.iter().cloned());
    paths.extend(extra.iter().cloned());
    paths.extend(SYSTEM_READ_ONLY.iter().map(PathBuf::from));
    paths
}

/// The read-only rules' paths, each opened once (an `O_PATH` descriptor) with the rights
/// it grants. Opened in the zygote, before its first fork: every worker inherits the
/// descriptors and adds its rules from them, so a worker walks none of these paths (13
/// paths, ~50 path lookups in `openat` and `statx` per worker otherwise: with the cgroup
/// join's, 3.8% of the machine's samples at concurrency 4, BENCHMARKS.md). A worker
/// closes them once its layers are on
/// (`fds::close_inherited`), before any code of a job runs. Missing paths are skipped, as
/// they are by a rule made from a path.
pub struct ReadOnlyRules {
    rules: Vec<(OwnedFd, BitFlags<AccessFs>)>,
}

impl ReadOnlyRules {
    /// Opens `paths` (see [`read_only_paths`]) in this process's mount namespace. Each
    /// descriptor is placed above the worker's fixed ones (`fds::above_fixed`), so that
    /// arranging a worker's fds never overwrites it.
    pub fn open(paths: &[PathBuf]) -> Self {
        let abi = TARGET_ABI;
        let rules = paths
            .iter()
            .filter_map(|path| {
                let fd = super::fds::above_fixed(open_path(path).ok()?).ok()?;
                // Directory rights (ReadDir) on a file would downgrade the rule.
                let access = if path.is_dir() {
                    AccessFs::from_read(abi)
                } else if path == Path::new("/dev/null") {
                    AccessFs::ReadFile | AccessFs::WriteFile
                } else {
                    AccessFs::from_read(abi) & AccessFs::from_file(abi)
                };
                Some((fd, access))
            })
            .collect();
        Self { rules }
    }

    /// The descriptors a worker keeps until its layers are on.
    pub fn fds(&self) -> Vec<RawFd> {
        self.rules.iter().map(|(fd, _)| fd.as_raw_fd()).collect()
    }
}

/// An `O_PATH` descriptor of `path`, as the crate's `PathFd` opens it.
fn open_path(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)?;
    Ok(file.into())
}

/// Restricts this process (and every thread it starts later). Returns how much the
/// kernel enforces.
pub fn restrict(read_only: &ReadOnlyRules, workspace: BorrowedFd<'_>) -> Result<String, String> {
    let abi = TARGET_ABI;
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err("handling filesystem access"))?
        .handle_access(AccessNet::from_all(abi))
        .map_err(err("handling network access"))?
        .scope(Scope::from_all(abi))
        .map_err(err("scoping signals and abstract sockets"))?
        .create()
        .map_err(err("creating the ruleset"))?;
    for (fd, access) in &read_only.rules {
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, *access))
            .map_err(err("adding a read-only rule"))?;
    }
    ruleset = ruleset
        .add_rule(PathBeneath::new(workspace, AccessFs::from_all(abi)))
        .map_err(err("adding the workspace rule"))?;
    let status = ruleset.restrict_self().map_err(err("restricting"))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok("fully enforced".into()),
        RulesetStatus::PartiallyEnforced => Ok("partially enforced (older kernel ABI)".into()),
        RulesetStatus::NotEnforced => Err("the kernel does not enforce Landlock".into()),
    }
}

fn err(doing: &'static str) -> impl Fn(landlock::RulesetError) -> String {
    move |e| format!("{doing}: {e}")
}

/// The kernel's Landlock ABI version, or why there is none.
pub fn kernel_abi() -> Result<i32, String> {
    // SAFETY: landlock_create_ruleset with a NULL attribute, size 0 and the VERSION flag
    // only returns the ABI version (or -1); it creates nothing.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v < 0 {
        Err(format!("no Landlock: {}", std::io::Error::last_os_error()))
    } else {
        Ok(v as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opened once, in the zygote: each path that exists, with the rights its kind allows
    /// (directory rights on a directory only, writes on `/dev/null` only), on a descriptor
    /// a worker's `fds::arrange` can keep while it places its own fixed ones.
    #[test]
    fn rule_paths_are_opened_once_above_a_workers_fixed_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ä file");
        std::fs::write(&file, "x").unwrap();
        let rules = ReadOnlyRules::open(&[
            dir.path().to_path_buf(),
            dir.path().join("missing"),
            file,
            PathBuf::from("/dev/null"),
        ]);
        assert_eq!(rules.rules.len(), 3, "the missing path is skipped");
        assert!(
            rules
                .fds()
                .iter()
                .all(|&fd| fd >= super::super::fds::FIRST_FREE),
            "{:?}",
            rules.fds()
        );
        let [(_, on_dir), (_, on_file), (_, on_null)] = &rules.rules[..] else {
            unreachable!()
        };
        assert!(on_dir.contains(AccessFs::ReadDir) && !on_dir.contains(AccessFs::WriteFile));
        assert!(on_file.contains(AccessFs::ReadFile) && !on_file.contains(AccessFs::ReadDir));
        assert_eq!(*on_null, AccessFs::ReadFile | AccessFs::WriteFile);
    }
}
