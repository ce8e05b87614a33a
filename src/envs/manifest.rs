//! The managed state on disk, `<envs_dir>/manifest.json`: which environment generation is
//! current, what the operator asked for, the import names each added distribution gave
//! the allowlist, and the base venv it was all built on. Written atomically (temporary
//! file, fsync, rename) only after a switch succeeded, so a crash leaves the old one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const MANIFEST_FILE: &str = "manifest.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The environment directory (a child of envs_dir) workers use; none before the first
    /// change.
    pub current: Option<String>,
    /// The operator's venv the generations are built on (`python.venv`).
    pub base_venv: Option<PathBuf>,
    /// The operator's requirements, canonical, by distribution name.
    pub requested: BTreeMap<String, String>,
    /// The top-level modules each requested distribution added to the allowlist.
    pub import_names: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid manifest ({source}); move it away to start over")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Manifest {
    /// The manifest in `envs_dir`, or an empty one when there is none yet.
    pub fn load(envs_dir: &Path) -> Result<Self, ManifestError> {
        let path = envs_dir.join(MANIFEST_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| ManifestError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ManifestError::Read { path, source }),
        }
    }

    pub fn save(&self, envs_dir: &Path) -> Result<(), ManifestError> {
        let path = envs_dir.join(MANIFEST_FILE);
        let tmp = envs_dir.join(format!(".{MANIFEST_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(envs_dir)?.sync_all()
        };
        write().map_err(|source| ManifestError::Write { path, source })
    }

    /// The current environment's directory, if there is one.
    pub fn current_dir(&self, envs_dir: &Path) -> Option<PathBuf> {
        self.current.as_ref().map(|name| envs_dir.join(name))
    }

    /// Every import name the managed distributions added.
    pub fn added_imports(&self) -> impl Iterator<Item = &String> {
        self.import_names.values().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_absence_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Manifest::default());
        let m = Manifest {
            current: Some("env-1".into()),
            base_venv: Some("/srv/.venv".into()),
            requested: [("tabulate".to_owned(), "tabulate==0.9.0".to_owned())].into(),
            import_names: [("tabulate".to_owned(), vec!["tabulate".to_owned()])].into(),
        };
        m.save(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);
        assert_eq!(m.current_dir(dir.path()), Some(dir.path().join("env-1")));
        std::fs::write(dir.path().join(MANIFEST_FILE), "{not json").unwrap();
        assert!(matches!(
            Manifest::load(dir.path()),
            Err(ManifestError::Parse { .. })
        ));
    }
}
