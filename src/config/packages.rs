//! `[packages]`: operator package management — the installer (`uv`), where environment
//! generations live, the only index installs come from, and how a distribution's import
//! names are found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PackagesConfig {
    /// The `uv` binary that builds environments (the setup scripts install a pinned one
    /// into `.venv-tools`).
    pub uv: PathBuf,
    /// Where environment generations, their manifest and uv's cache live; default
    /// `<worker.state_dir>/envs`.
    pub envs_dir: Option<PathBuf>,
    /// uv's cache; default `<envs_dir>/uv-cache`. On the same filesystem as envs_dir,
    /// environments are hard-linked from it (a generation costs little disk).
    pub cache_dir: Option<PathBuf>,
    /// The package index installs come from (and no other).
    pub index_url: String,
    /// Local directories of wheels or sdists searched besides the index (`--find-links`).
    pub find_links: Vec<PathBuf>,
    /// A constraints file every install honours (`--constraint`).
    pub constraints: Option<PathBuf>,
    /// `"auto"` (read from the installed distribution's RECORD / top_level.txt) or an
    /// explicit table `{ distribution = ["import", "names"] }`.
    pub import_names: ImportNames,
    /// Whether a distribution without a wheel may be built from its sdist. Off: building
    /// runs the package's own build code on the host, as the service's user, before any
    /// sandbox; only wheels are installed.
    pub build_from_source: bool,
    /// The longest one install, and then the compilation of its bytecode, may each take
    /// before it is killed.
    pub install_timeout_seconds: u64,
}

impl Default for PackagesConfig {
    fn default() -> Self {
        Self {
            uv: PathBuf::from(".venv-tools/bin/uv"),
            envs_dir: None,
            cache_dir: None,
            index_url: DEFAULT_INDEX_URL.to_owned(),
            find_links: Vec::new(),
            constraints: None,
            import_names: ImportNames::default(),
            build_from_source: false,
            install_timeout_seconds: 600,
        }
    }
}

pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/simple";

impl PackagesConfig {
    /// The directory of environment generations.
    pub fn envs_dir(&self, state_dir: &Path) -> PathBuf {
        self.envs_dir
            .clone()
            .unwrap_or_else(|| state_dir.join("envs"))
    }

    pub(super) fn problem(&self) -> Option<String> {
        if self.install_timeout_seconds == 0 {
            return Some("packages.install_timeout_seconds must be positive".into());
        }
        let url = self.index_url.trim();
        if !(url.starts_with("https://")
            || url.starts_with("http://")
            || url.starts_with("file://"))
        {
            return Some(format!(
                "packages.index_url {url:?} must be an http(s):// or file:// URL"
            ));
        }
        if let ImportNames::Explicit(map) = &self.import_names
            && let Some((dist, _)) = map.iter().find(|(_, names)| names.is_empty())
        {
            return Some(format!(
                "packages.import_names.{dist} is empty: list the modules it provides"
            ));
        }
        None
    }
}

/// How the import names of an added distribution are found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ImportNames {
    /// `"auto"`.
    Auto(AutoTag),
    /// Distribution name → the top-level modules user code may import from it.
    Explicit(BTreeMap<String, Vec<String>>),
}

impl Default for ImportNames {
    fn default() -> Self {
        ImportNames::Auto(AutoTag::Auto)
    }
}

/// The one string `import_names` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoTag {
    Auto,
}

impl ImportNames {
    /// The configured names for `dist` (any spelling of the name), if set explicitly.
    pub fn explicit_for(&self, normalized_dist: &str) -> Option<&[String]> {
        match self {
            ImportNames::Auto(_) => None,
            ImportNames::Explicit(map) => map
                .iter()
                .find(|(name, _)| normalize_dist_name(name) == normalized_dist)
                .map(|(_, names)| names.as_slice()),
        }
    }
}

/// PEP 503 normalisation: lower case, runs of `-`, `_`, `.` become one `-`.
pub fn normalize_dist_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut pending_dash = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            pending_dash = true;
            continue;
        }
        if pending_dash && !out.is_empty() {
            out.push('-');
        }
        pending_dash = false;
        out.extend(c.to_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_names_are_auto_or_a_table() {
        #[derive(Deserialize)]
        struct T {
            import_names: ImportNames,
        }
        let t: T = toml::from_str("import_names = \"auto\"").unwrap();
        assert_eq!(t.import_names, ImportNames::default());
        let t: T = toml::from_str("import_names = { beautifulsoup4 = [\"bs4\"] }").unwrap();
        assert_eq!(
            t.import_names.explicit_for("beautifulsoup4"),
            Some(&["bs4".to_owned()][..])
        );
        assert!(toml::from_str::<T>("import_names = \"guess\"").is_err());
    }

    #[test]
    fn names_normalise_as_pep_503_says() {
        assert_eq!(normalize_dist_name("Foo.Bar__baz-"), "foo-bar-baz");
        assert_eq!(normalize_dist_name("tabulate"), "tabulate");
        assert_eq!(normalize_dist_name("Python_DateUtil"), "python-dateutil");
    }

    #[test]
    fn bad_values_are_named() {
        let mut c = PackagesConfig {
            index_url: "pypi.org".into(),
            ..PackagesConfig::default()
        };
        assert!(c.problem().unwrap().contains("index_url"));
        c.index_url = DEFAULT_INDEX_URL.into();
        assert_eq!(c.problem(), None);
        c.import_names = ImportNames::Explicit([("x".to_owned(), Vec::new())].into());
        assert!(c.problem().unwrap().contains("import_names.x"));
    }
}
