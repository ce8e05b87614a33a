//! What an environment holds, read from its files (no interpreter, no installer): the
//! installed distributions (`*.dist-info/METADATA`) and the top-level modules each one
//! provides (`top_level.txt`, else its `RECORD`). The files are read by
//! [`snakecage_worker::distinfo`], which the zygote's package scan shares.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;
use snakecage_worker::distinfo::DistInfo;

use crate::config::normalize_dist_name;

/// One installed distribution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dist {
    /// The PEP 503 name.
    pub name: String,
    pub version: String,
    #[serde(skip)]
    pub dist_info: PathBuf,
}

/// The site-packages directory of the venv at `venv`.
pub fn site_packages(venv: &Path) -> Option<PathBuf> {
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages"))
        .find(|p| p.is_dir())
}

/// Every distribution installed in `site` whose METADATA names it and its version, by
/// name.
pub fn installed(site: &Path) -> std::io::Result<Vec<Dist>> {
    let mut dists = Vec::new();
    for info in DistInfo::all_in(site)? {
        let headers = info.headers();
        if let (Some(name), Some(version)) = (headers.name, headers.version) {
            dists.push(Dist {
                name: normalize_dist_name(&name),
                version,
                dist_info: info.path().to_path_buf(),
            });
        }
    }
    dists.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(dists)
}

/// The top-level modules `dist` provides: `top_level.txt` when the build wrote one, else
/// the first path component of each importable file in `RECORD` (`pkg/__init__.py` ⇒
/// `pkg`, `mod.py` or `mod.cpython-311-x86_64-linux-gnu.so` ⇒ `mod`). Private names
/// (`_foo`) are left out: they are implementation modules.
pub fn import_names(dist: &Dist) -> Vec<String> {
    let info = DistInfo::at(&dist.dist_info);
    let mut names = BTreeSet::new();
    if let Some(text) = info.top_level_txt() {
        names.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.contains('/'))
                .map(str::to_owned),
        );
    }
    if names.is_empty() {
        names.extend(
            info.record_paths()
                .iter()
                .filter_map(|path| top_level_module(path)),
        );
    }
    names
        .into_iter()
        .filter(|n| !n.starts_with('_') && is_identifier(n))
        .collect()
}

fn top_level_module(path: &str) -> Option<String> {
    if path.starts_with("..") || path.starts_with('/') {
        return None;
    }
    let (first, rest) = match path.split_once('/') {
        Some((first, rest)) => (first, Some(rest)),
        None => (path, None),
    };
    if first.ends_with(".dist-info") || first.ends_with(".data") || first == "__pycache__" {
        return None;
    }
    match rest {
        // A package: it has an `__init__.py` (or a compiled module) directly inside.
        Some(rest) => {
            (rest == "__init__.py" || rest.starts_with("__init__.")).then(|| first.to_owned())
        }
        None => {
            let stem = first.strip_suffix(".py").or_else(|| {
                first
                    .strip_suffix(".so")
                    .map(|s| s.split('.').next().unwrap_or(s))
            })?;
            Some(stem.to_owned())
        }
    }
}

fn is_identifier(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_dist(site: &Path, name: &str, version: &str, record: &str, top: Option<&str>) {
        let info = site.join(format!("{name}-{version}.dist-info"));
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nName: not-this\n"),
        )
        .unwrap();
        std::fs::write(info.join("RECORD"), record).unwrap();
        if let Some(top) = top {
            std::fs::write(info.join("top_level.txt"), top).unwrap();
        }
    }

    #[test]
    fn distributions_and_their_modules_are_read_from_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path();
        fake_dist(
            site,
            "Tabulate",
            "0.9.0",
            "tabulate/__init__.py,sha256=x,1\ntabulate/version.py,,\n../../bin/tabulate,,\ntabulate-0.9.0.dist-info/RECORD,,\n",
            None,
        );
        fake_dist(
            site,
            "six",
            "1.17.0",
            "six.py,,\n__pycache__/six.cpython-311.pyc,,\n",
            None,
        );
        fake_dist(
            site,
            "beautifulsoup4",
            "4.12.0",
            "bs4/__init__.py,,\n",
            Some("bs4\n"),
        );
        fake_dist(
            site,
            "fastmod",
            "1.0",
            "fastmod.cpython-311-x86_64-linux-gnu.so,,\n_fastmod_impl.py,,\n",
            None,
        );
        let dists = installed(site).unwrap();
        let names: Vec<_> = dists
            .iter()
            .map(|d| (d.name.as_str(), d.version.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("beautifulsoup4", "4.12.0"),
                ("fastmod", "1.0"),
                ("six", "1.17.0"),
                ("tabulate", "0.9.0")
            ]
        );
        let imports: Vec<Vec<String>> = dists.iter().map(import_names).collect();
        assert_eq!(
            imports,
            [vec!["bs4"], vec!["fastmod"], vec!["six"], vec!["tabulate"]]
        );
    }

    #[test]
    fn a_venv_names_its_site_packages() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(site_packages(dir.path()), None);
        let site = dir.path().join("lib/python3.12/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        assert_eq!(site_packages(dir.path()), Some(site));
    }
}
