//! What user code may import, as `GET /v1/packages` and the tool descriptions report it:
//! the standard-library modules of `python-stdlib-allowlist` (parsed in one place, the
//! worker library) and the allowed third-party packages with the versions the zygote found.

use serde::Serialize;
use snakecage_worker::allowlist::{AllowedModule, stdlib_allowlist};
use snakecage_worker::protocol::ZygoteInfo;

#[derive(Debug, Clone, Serialize)]
pub struct Packages {
    pub python_version: String,
    pub stdlib: Vec<AllowedModule>,
    pub packages: Vec<ThirdParty>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ThirdParty {
    pub name: String,
    /// `None` when the package is allowed but not installed.
    pub version: Option<String>,
    pub installed: bool,
}

impl Packages {
    /// `allowed` are top-level import names; their versions come from what the zygote
    /// imported at start-up.
    pub fn new(info: &ZygoteInfo, allowed: &[String]) -> Self {
        let packages = allowed
            .iter()
            .map(|name| {
                let loaded = info.preloaded.iter().find(|m| &m.name == name);
                ThirdParty {
                    name: name.clone(),
                    version: loaded.and_then(|m| m.version.clone()),
                    installed: loaded.is_some(),
                }
            })
            .collect();
        Self {
            python_version: info.python_version.clone(),
            stdlib: stdlib_allowlist().to_vec(),
            packages,
        }
    }

    /// Installed third-party packages with versions, for tool descriptions.
    pub fn installed(&self) -> Vec<(String, Option<String>)> {
        self.packages
            .iter()
            .filter(|p| p.installed)
            .map(|p| (p.name.clone(), p.version.clone()))
            .collect()
    }
}

/// The third-party top-level packages user code may import.
pub fn allowed(config: &crate::config::Config) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for module in &config.python.preload {
        let top = module.split('.').next().unwrap_or(module).to_owned();
        if !names.contains(&top) {
            names.push(top);
        }
    }
    names
}
