//! What a session's workspace costs the instance's workspace file system, measured by the
//! snapshot taken after each of its runs: without per-user quotas on tmpfs, this check is
//! what keeps one session from holding the shared space for its whole life.

use std::os::unix::fs::MetadataExt;

/// The space and entries a workspace's snapshot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes allocated (`st_blocks` × 512), directories included: a sparse file counts
    /// as what it costs, not as its length.
    pub bytes: u64,
    /// Files, directories and anything else.
    pub entries: u64,
    /// Whether every entry was looked at. Not past `workspace.max_entries`, nor below a
    /// directory too deep (or of too long a path) to be descended, nor in one that could
    /// not be read: what hides there cannot be measured, so it counts as over the bound.
    pub whole: bool,
}

impl Default for Footprint {
    fn default() -> Self {
        Self {
            bytes: 0,
            entries: 0,
            whole: true,
        }
    }
}

impl Footprint {
    /// An entry the walk could not read: not whole, unless it was only swapped or removed
    /// since it was listed (the session's own threads go on between runs), in which case
    /// what it became is counted where the walk finds it.
    pub(super) fn unreadable(&mut self, e: &std::io::Error) {
        let raced = matches!(
            e.raw_os_error(),
            Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
        );
        if !raced {
            self.whole = false;
        }
    }

    pub(super) fn add(&mut self, meta: &std::fs::Metadata) {
        self.bytes = self.bytes.saturating_add(meta.blocks().saturating_mul(512));
        self.entries += 1;
    }

    /// Why this footprint is past `max_bytes` or `max_entries`, if it is.
    pub fn over(&self, max_bytes: u64, max_entries: usize) -> Option<String> {
        let mib = |bytes: u64| bytes.div_ceil(1 << 20);
        if !self.whole {
            Some(format!(
                "its workspace could not be measured whole (more than {max_entries} entries \
                 (workspace.max_entries), directories too deep or unreadable), so it counts as \
                 over its bound"
            ))
        } else if self.bytes > max_bytes {
            Some(format!(
                "its workspace takes {} MiB, over the {} MiB a session's workspace may hold \
                 (sessions.max_workspace_mb, at most a quarter of the workspace file system)",
                mib(self.bytes),
                mib(max_bytes)
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_file_counts_as_what_it_allocates_and_the_bounds_name_their_settings() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        std::fs::write(dir.path().join("full"), vec![1u8; 3 << 20]).unwrap();
        let mut footprint = Footprint::default();
        for name in ["sparse", "full"] {
            footprint.add(&std::fs::metadata(dir.path().join(name)).unwrap());
        }
        assert_eq!(footprint.entries, 2);
        assert!(
            footprint.bytes >= 3 << 20 && footprint.bytes < 4 << 20,
            "{footprint:?}"
        );
        assert_eq!(footprint.over(4 << 20, 10), None);
        let why = footprint.over(2 << 20, 10).unwrap();
        assert!(why.contains("takes 3 MiB, over the 2 MiB"), "{why}");
        assert!(why.contains("sessions.max_workspace_mb"), "{why}");
        let partial = Footprint {
            whole: false,
            ..footprint
        };
        assert!(
            partial
                .over(u64::MAX, 10)
                .unwrap()
                .contains("workspace.max_entries")
        );
    }
}
