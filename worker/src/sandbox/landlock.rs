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

use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr,
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

/// Restricts this process (and every thread it starts later). Returns how much the
/// kernel enforces.
pub fn restrict(read_only: &[PathBuf], workspace: BorrowedFd<'_>) -> Result<String, String> {
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
    for path in read_only {
        let Ok(fd) = PathFd::new(path) else { continue };
        // Directory rights (ReadDir) on a file would downgrade the rule.
        let access = if path.is_dir() {
            AccessFs::from_read(abi)
        } else if path == Path::new("/dev/null") {
            AccessFs::ReadFile | AccessFs::WriteFile
        } else {
            AccessFs::from_read(abi) & AccessFs::from_file(abi)
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
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
