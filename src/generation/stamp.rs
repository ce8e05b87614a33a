//! The environment half of "nothing changed": a stamp of the files a generation imports
//! from (each site-packages directory of its `[python]` layout: every file's path, size,
//! modification time and, for a symlink, its target; bytecode caches aside). Two stamps
//! are equal when no file there was added, removed, replaced or rewritten.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::config::Config;

/// What the files of one generation's environment looked like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvStamp {
    files: u64,
    hash: u64,
}

impl EnvStamp {
    /// Reads the site-packages directories `config` resolves to (tens of milliseconds for
    /// a venv with numpy, pandas and matplotlib: run it off the async threads). `None` when
    /// the layout cannot be resolved or a directory cannot be read: such an environment is
    /// never taken as unchanged.
    pub fn read(config: &Config) -> Option<Self> {
        let layout = config.python.layout().ok()?;
        let mut hasher = DefaultHasher::new();
        let mut files = 0;
        for dir in &layout.site_packages {
            dir.hash(&mut hasher);
            walk(dir, Path::new(""), &mut hasher, &mut files).ok()?;
        }
        Some(Self {
            files,
            hash: hasher.finish(),
        })
    }

    /// [`EnvStamp::read`] on a blocking thread.
    pub async fn read_off_thread(config: &Config) -> Option<Self> {
        let config = config.clone();
        tokio::task::spawn_blocking(move || Self::read(&config))
            .await
            .ok()
            .flatten()
    }
}

/// Hashes every entry under `root/rel`, in name order.
fn walk(
    root: &Path,
    rel: &Path,
    hasher: &mut DefaultHasher,
    files: &mut u64,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(rel))?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(|e| e.file_name())
        .collect();
    entries.sort();
    for name in entries {
        // The interpreter may write bytecode caches beside the sources it imports.
        if name == "__pycache__" || Path::new(&name).extension().is_some_and(|e| e == "pyc") {
            continue;
        }
        let rel = rel.join(&name);
        let path = root.join(&rel);
        let meta = std::fs::symlink_metadata(&path)?;
        rel.hash(hasher);
        if meta.is_dir() {
            // Its own times move with its entries (a new bytecode cache among them).
            walk(root, &rel, hasher, files)?;
            continue;
        }
        meta.len().hash(hasher);
        meta.mtime().hash(hasher);
        meta.mtime_nsec().hash(hasher);
        meta.ino().hash(hasher);
        if meta.file_type().is_symlink() {
            std::fs::read_link(&path)?.hash(hasher);
        }
        *files += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_on(site: &Path) -> Config {
        let mut config = Config::default();
        config.python.venv = None;
        config.python.site_packages = vec![site.to_path_buf()];
        config
    }

    #[test]
    fn a_file_added_rewritten_or_removed_changes_the_stamp_and_bytecode_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("pkg");
        std::fs::create_dir(&pkg).unwrap();
        std::fs::write(pkg.join("__init__.py"), "x = 1\n").unwrap();
        let config = config_on(dir.path());
        let first = EnvStamp::read(&config).unwrap();
        assert_eq!(first.files, 1);
        assert_eq!(EnvStamp::read(&config), Some(first));

        std::fs::create_dir(pkg.join("__pycache__")).unwrap();
        std::fs::write(pkg.join("__pycache__/__init__.cpython-311.pyc"), b"\0").unwrap();
        assert_eq!(EnvStamp::read(&config), Some(first));

        std::fs::write(pkg.join("módulo_é.py"), "y = 2\n").unwrap();
        let added = EnvStamp::read(&config).unwrap();
        assert_ne!(added, first);
        // Same size, new contents (a new file renamed over it, as installers do).
        std::fs::write(dir.path().join("new.py"), "x = 2\n").unwrap();
        std::fs::rename(dir.path().join("new.py"), pkg.join("__init__.py")).unwrap();
        let rewritten = EnvStamp::read(&config).unwrap();
        assert_ne!(rewritten, added);
        std::fs::remove_file(pkg.join("módulo_é.py")).unwrap();
        assert_ne!(EnvStamp::read(&config).unwrap(), rewritten);

        // A directory that cannot be read is never "unchanged".
        let gone = config_on(&dir.path().join("missing"));
        assert_eq!(EnvStamp::read(&gone), None);
    }
}
