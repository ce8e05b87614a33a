//! `[python]`: the interpreter and the packages user code may import, and the venv
//! layout they resolve to.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PythonConfig {
    /// A virtualenv whose site-packages user code may import from, and whose base
    /// interpreter runs the workers (its `pyvenv.cfg` names it).
    pub venv: Option<PathBuf>,
    /// CPython's prefix; overrides the one `venv` names.
    pub home: Option<PathBuf>,
    /// Extra directories appended to `sys.path`.
    pub site_packages: Vec<PathBuf>,
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            venv: Some(PathBuf::from(".venv")),
            home: None,
            site_packages: Vec::new(),
        }
    }
}

/// Where the Python side lives, resolved from [`PythonConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonLayout {
    pub home: Option<PathBuf>,
    pub site_packages: Vec<PathBuf>,
}

impl PythonConfig {
    /// A `site_packages` entry that is not a directory: named, rather than left out of
    /// `sys.path` without a word (its imports would fail in every run).
    pub fn problem(&self) -> Option<String> {
        self.site_packages.iter().find_map(|dir| {
            let what = match std::fs::metadata(dir) {
                Ok(meta) if meta.is_dir() => return None,
                Ok(_) => "is not a directory".to_owned(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_owned(),
                Err(e) => format!("cannot be read: {e}"),
            };
            Some(format!(
                "python.site_packages entry {} {what}; give directories of importable modules",
                dir.display()
            ))
        })
    }

    /// Resolves the venv (if present) into a home and its site-packages directory. A
    /// configured venv that does not exist is an error: silently running without the
    /// packages the operator asked for would be worse.
    pub fn layout(&self) -> Result<PythonLayout, ConfigError> {
        let mut layout = PythonLayout {
            home: self.home.clone(),
            site_packages: Vec::new(),
        };
        if let Some(venv) = &self.venv {
            let cfg_path = venv.join("pyvenv.cfg");
            let cfg = std::fs::read_to_string(&cfg_path).map_err(|e| {
                ConfigError::Invalid(format!(
                    "python.venv {}: cannot read {}: {e} (create it with the README's first command, or set python.venv)",
                    venv.display(),
                    cfg_path.display()
                ))
            })?;
            if layout.home.is_none() {
                layout.home = venv_home(&cfg);
            }
            let lib = venv.join("lib");
            let site = std::fs::read_dir(&lib)
                .map_err(|e| {
                    ConfigError::Invalid(format!("python.venv: cannot list {}: {e}", lib.display()))
                })?
                .filter_map(Result::ok)
                .map(|entry| entry.path().join("site-packages"))
                .find(|p| p.is_dir())
                .ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "python.venv: no site-packages under {}",
                        lib.display()
                    ))
                })?;
            layout
                .site_packages
                .push(std::path::absolute(site).map_err(|e| ConfigError::Invalid(e.to_string()))?);
        }
        layout
            .site_packages
            .extend(self.site_packages.iter().cloned());
        Ok(layout)
    }
}

/// `home = /prefix/bin` in pyvenv.cfg names the base interpreter's bin directory.
fn venv_home(cfg: &str) -> Option<PathBuf> {
    cfg.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "home")
            .then(|| PathBuf::from(value.trim()).parent().map(Path::to_path_buf))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_packages_entries_must_be_directories() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("modulé.py");
        std::fs::write(&file, "x = 1\n").unwrap();
        let missing = dir.path().join("absent-ü");
        let with = |paths: Vec<PathBuf>| PythonConfig {
            site_packages: paths,
            ..PythonConfig::default()
        };
        assert_eq!(with(vec![dir.path().to_path_buf()]).problem(), None);
        assert_eq!(
            with(vec![dir.path().to_path_buf(), missing.clone()]).problem(),
            Some(format!(
                "python.site_packages entry {} does not exist; give directories of importable modules",
                missing.display()
            ))
        );
        assert_eq!(
            with(vec![file.clone()]).problem(),
            Some(format!(
                "python.site_packages entry {} is not a directory; give directories of importable modules",
                file.display()
            ))
        );
    }

    #[test]
    fn pyvenv_home_is_the_prefix_above_bin() {
        let cfg = "home = /opt/py/3.12.1/bin\ninclude-system-site-packages = false\n";
        assert_eq!(venv_home(cfg), Some(PathBuf::from("/opt/py/3.12.1")));
        assert_eq!(venv_home("version = 3.12\n"), None);
    }
}
