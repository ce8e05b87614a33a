//! Deleting old environment generations: every `env-*` directory of the environments
//! directory but the ones to keep and those a live process still uses. A zygote (and each
//! worker it forked) maps its preloaded extension modules from its environment and, when
//! it runs in its own mount namespace, has that environment's site-packages mounted; either
//! shows in `/proc/<pid>/maps` or `/proc/<pid>/mountinfo`. A directory one of them names is
//! kept until a later sweep (a few follow each switch; then the next switch, or the next
//! start).
//!
//! While the service runs, only generations OLDER than the current one are candidates
//! (names are `env-<uuid v7>`, ordered by creation): one a change is building right now is
//! newer, and is never touched.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ENV_PREFIX, remove_env_dir};

/// Which generations a sweep may remove.
#[derive(Debug, Clone, Copy)]
pub enum Sweep<'a> {
    /// At start-up, before any zygote runs: every generation but `keep`.
    AtStart { keep: Option<&'a Path> },
    /// While serving: generations older than `current` that no process uses.
    Running { current: &'a Path },
}

/// What a sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub removed: Vec<PathBuf>,
    /// Older generations still in use by a process.
    pub in_use: Vec<PathBuf>,
}

/// Removes the generations below `envs_dir` that `sweep` allows.
pub fn remove_unused(envs_dir: &Path, sweep: Sweep<'_>) -> Swept {
    let Ok(entries) = std::fs::read_dir(envs_dir) else {
        return Swept::default();
    };
    let keep = match sweep {
        Sweep::AtStart { keep } => keep,
        Sweep::Running { current } => Some(current),
    };
    let older_than_current = |p: &PathBuf| match sweep {
        Sweep::AtStart { .. } => true,
        Sweep::Running { current } => p.file_name() < current.file_name(),
    };
    let candidates: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(ENV_PREFIX))
                && e.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|e| e.path())
        .filter(|p| Some(p.as_path()) != keep && older_than_current(p))
        .collect();
    let mut swept = Swept::default();
    if candidates.is_empty() {
        return swept;
    }
    let used = match sweep {
        Sweep::Running { .. } => used_by_processes(&candidates),
        Sweep::AtStart { .. } => BTreeSet::new(),
    };
    for dir in candidates {
        if used.contains(&dir) {
            tracing::debug!(environment = %dir.display(), "an old environment is still in use; kept until a later sweep");
            swept.in_use.push(dir);
            continue;
        }
        remove_env_dir(&dir);
        tracing::info!(environment = %dir.display(), "old environment removed");
        swept.removed.push(dir);
    }
    swept
}

/// Sweeps old generations after a switch: the old zygotes retire when their last job or
/// session ends, so a generation still in use is looked at again a little later (for ten
/// minutes; after that, at the next switch or start).
pub(super) async fn sweep_after_switch(envs_dir: PathBuf, current: PathBuf) {
    const INTERVAL: Duration = Duration::from_secs(30);
    const SWEEPS: usize = 20;
    for _ in 0..SWEEPS {
        let (dir, cur) = (envs_dir.clone(), current.clone());
        let swept = tokio::task::spawn_blocking(move || {
            remove_unused(&dir, Sweep::Running { current: &cur })
        })
        .await
        .unwrap_or_default();
        if swept.in_use.is_empty() {
            return;
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

/// Which of `dirs` a process's memory maps or mounts name.
fn used_by_processes(dirs: &[PathBuf]) -> BTreeSet<PathBuf> {
    let prefixes: Vec<(String, &PathBuf)> = dirs
        .iter()
        .map(|d| (format!("{}/", d.display()), d))
        .collect();
    let mut used = BTreeSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return dirs.iter().cloned().collect();
    };
    for entry in procs.filter_map(Result::ok) {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        for file in ["maps", "mountinfo"] {
            let Ok(text) = std::fs::read_to_string(entry.path().join(file)) else {
                continue;
            };
            for (prefix, dir) in &prefixes {
                if text.contains(prefix.as_str()) {
                    used.insert((*dir).clone());
                }
            }
        }
        if used.len() == dirs.len() {
            break;
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unused_generations_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let envs = dir.path();
        for name in ["env-a", "env-b", "env-c", "uv-cache", "other"] {
            std::fs::create_dir(envs.join(name)).unwrap();
        }
        std::fs::write(envs.join("manifest.json"), "{}").unwrap();
        // While serving, a generation newer than the current one (being built) is left.
        let keep = envs.join("env-b");
        let swept = remove_unused(envs, Sweep::Running { current: &keep });
        assert_eq!(swept.removed, [envs.join("env-a")]);
        assert!(envs.join("env-c").is_dir());
        let mut removed = remove_unused(envs, Sweep::AtStart { keep: Some(&keep) }).removed;
        removed.sort();
        assert_eq!(removed, [envs.join("env-c")]);
        assert!(envs.join("env-b").is_dir());
        assert!(envs.join("uv-cache").is_dir() && envs.join("other").is_dir());
        assert!(!envs.join("env-a").exists() && !envs.join("env-c").exists());
    }

    #[test]
    fn a_generation_a_process_maps_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let envs = dir.path();
        let used = envs.join("env-used");
        std::fs::create_dir_all(used.join("lib")).unwrap();
        let lib = used.join("lib/mapped.bin");
        std::fs::write(&lib, vec![0u8; 4096]).unwrap();
        // This test process maps a file of the environment, as a zygote maps numpy's .so.
        let file = std::fs::File::open(&lib).unwrap();
        // SAFETY: a read-only private map of a file nobody writes, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        std::fs::create_dir(envs.join("env-free")).unwrap();
        let current = envs.join("env-zz-current");
        let swept = remove_unused(envs, Sweep::Running { current: &current });
        assert_eq!(swept.removed, [envs.join("env-free")]);
        assert_eq!(swept.in_use, std::slice::from_ref(&used));
        assert!(used.is_dir());
        // SAFETY: the mapping made above, of that length.
        unsafe { libc::munmap(addr, 4096) };
        let swept = remove_unused(envs, Sweep::Running { current: &current });
        assert_eq!(swept.removed, [used]);
    }
}
