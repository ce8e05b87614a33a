//! Joining the instance's cgroup: the supervisor made it (and bounds it: `pids.max`), each
//! worker moves itself in as the first step of its hardening, while it is still the
//! zygote's uid and before Landlock would hide `/sys`. The zygotes stay outside it, so a
//! cgroup full of one tenant's threads never stops a fork: the new worker joins (moving a
//! process in is not refused at the bound) and can start no thread of its own until some
//! are gone.

use std::io::{self, Write};
use std::path::Path;

use crate::priority::LockStep;

/// Moves this process into the cgroup of each file: a v1 cgroup's `tasks` (this process
/// has one thread here: the supervisor chose the file, see `JOIN_V1` in
/// `src/pool/cgroup/mod.rs`) or v2's `cgroup.procs`; `0` names the writer itself. At a
/// normal process's CPU weight: the move holds the kernel's `cgroup_mutex`, which every
/// other worker's join waits for ([`LockStep`]).
pub fn join(procs: &[impl AsRef<Path>]) -> io::Result<()> {
    let _weight = LockStep::enter();
    for file in procs {
        let file = file.as_ref();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        f.write_all(b"0")
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    }
    Ok(())
}
