//! What `GET /v1/admin/packages` reports of the serving environment: its distributions,
//! which ones the operator added (with the requirement and import names), the installer.

use std::path::PathBuf;

use serde::Serialize;

use super::{EnvError, EnvManager, dists, io};
use crate::config::Config;

/// One installed distribution, as the admin API lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ListedDist {
    pub name: String,
    pub version: String,
    /// Added by the operator (through package management), not part of the base venv.
    pub added: bool,
    /// The operator's requirement, for added ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requirement: Option<String>,
    /// What user code may import from it (added ones).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub import_names: Vec<String>,
}

/// What `GET /v1/admin/packages` reports of the environment.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// The environment directory workers use.
    pub environment: Option<PathBuf>,
    /// Whether it is a managed generation (false: still the operator's base venv).
    pub managed: bool,
    pub base_venv: Option<PathBuf>,
    pub index_url: String,
    pub uv: PathBuf,
    pub uv_available: bool,
    pub distributions: Vec<ListedDist>,
}

impl EnvManager {
    /// The environment `live` runs on, with what the operator added marked.
    pub fn list(&self, live: &Config) -> Result<Listing, EnvError> {
        let manifest = self.manifest();
        let base = self.base.lock().unwrap().clone();
        let env = live.python.venv.clone();
        let distributions = match env.as_deref().and_then(dists::site_packages) {
            Some(site) => dists::installed(&site).map_err(io(&site))?,
            None => Vec::new(),
        };
        let managed = env
            .as_ref()
            .is_some_and(|e| manifest.current_dir(&self.envs_dir).as_ref() == Some(e));
        Ok(Listing {
            environment: env,
            managed,
            base_venv: base.venv,
            index_url: self.uv.index_url.clone(),
            uv: self.uv.binary.clone(),
            uv_available: self.uv.check().is_ok(),
            distributions: distributions
                .into_iter()
                .map(|d| ListedDist {
                    added: manifest.requested.contains_key(&d.name),
                    requirement: manifest.requested.get(&d.name).cloned(),
                    import_names: manifest
                        .import_names
                        .get(&d.name)
                        .cloned()
                        .unwrap_or_default(),
                    name: d.name,
                    version: d.version,
                })
                .collect(),
        })
    }
}
