//! What user code may import, as `GET /v1/packages` and the tool descriptions report it:
//! the standard-library modules of `python-stdlib-allowlist` (parsed in one place, the
//! worker library) and the allowed third-party packages (`sandbox.allowed_packages`, the
//! import guard's list) with what the zygote found of each.

use serde::Serialize;
use snakecage_worker::allowlist::{AllowedModule, stdlib_allowlist};
use snakecage_worker::protocol::{PackageInfo, ZygoteInfo};

#[derive(Debug, Clone, Serialize)]
pub struct Packages {
    pub python_version: String,
    pub stdlib: Vec<AllowedModule>,
    pub packages: Vec<PackageInfo>,
}

impl Packages {
    pub fn new(info: &ZygoteInfo) -> Self {
        Self {
            python_version: info.python_version.clone(),
            stdlib: stdlib_allowlist().to_vec(),
            packages: info.packages.clone(),
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
