//! Deleting old environment generations: every `env-*` directory of the environments
//! directory but the ones to keep and those a live process still uses. A zygote (and each
//! worker it forked) maps its preloaded extension modules from its environment and, when
//! it runs in its own mount namespace, has that environment's site-packages mounted; either
//! shows in `/proc/<pid>/maps` or `/proc/<pid>/mountinfo`. A directory one of them names is
//! kept until a later sweep (the next switch, or the next start).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{ENV_PREFIX, remove_env_dir};

/// Removes unused generations below `envs_dir`; with `check_processes`, also keeps those a
/// running process uses. Returns the directories removed.
pub fn remove_unused(envs_dir: &Path, keep: &[PathBuf], check_processes: bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(envs_dir) else {
        return Vec::new();
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
        .filter(|p| !keep.contains(p))
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    let used = if check_processes {
        used_by_processes(&candidates)
    } else {
        BTreeSet::new()
    };
    let mut removed = Vec::new();
    for dir in candidates {
        if used.contains(&dir) {
            tracing::info!(environment = %dir.display(), "an old environment is still in use; kept until a later sweep");
            continue;
        }
        remove_env_dir(&dir);
        tracing::info!(environment = %dir.display(), "old environment removed");
        removed.push(dir);
    }
    removed
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
        let mut removed = remove_unused(envs, &[envs.join("env-b")], false);
        removed.sort();
        assert_eq!(removed, [envs.join("env-a"), envs.join("env-c")]);
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
        let removed = remove_unused(envs, &[], true);
        assert_eq!(removed, [envs.join("env-free")]);
        assert!(used.is_dir());
        // SAFETY: the mapping made above, of that length.
        unsafe { libc::munmap(addr, 4096) };
        assert_eq!(remove_unused(envs, &[], true), [used]);
    }
}
