//! Operator package management: environment generations on disk. A change (add, remove,
//! sync) never touches the environment a running zygote uses: it builds a NEW environment
//! directory with `uv` (a fresh venv on the base venv's interpreter, the base venv's exact
//! pins plus the operator's requested set, hard-linked from uv's cache), gives it bytecode
//! (the serving environment's, for the files the two share), reads the added
//! distributions' import names, and hands the next configuration to the rollover. Only
//! after the switch is the manifest rewritten; on any failure the new directory is deleted
//! and nothing else has changed.
//!
//! A change that changes nothing builds nothing and rolls nothing over ([`Prepare::Unchanged`]):
//! when the requested set after it is the one the serving environment was built from
//! (the same requirement texts: an add of what is already there, a sync of the same
//! requirements, a remove of what is installed nowhere), nothing runs at all; when the
//! texts differ but the installer resolves them to exactly the distributions (names and
//! versions) the serving environment has, and the allowlist comes out the same, the new
//! directory is deleted, the new texts are recorded, and the serving generation stays.
//!
//! - [`spec`]: requirements and names, checked before anything runs.
//! - [`requirements`]: requirements.txt bodies, read as pip reads them (hash pins refused).
//! - [`plan`]: what a change means: the requested set, the installer's requirements and
//!   constraints.
//! - [`uv`]: running the installer (argument vectors, deadline, errors sorted).
//! - [`bytecode`]: the new environment's bytecode, reused from the serving one where its
//!   sources are the same files, compiled where not.
//! - `background`: how the installer and the compiler run (niceness, deadline, output).
//! - [`dists`]: installed distributions and their import names, read from the files.
//! - [`manifest`]: the managed state that survives a restart.
//! - `listing`: what `GET /v1/admin/packages` reports of the serving environment.
//! - [`gc`]: deleting environment directories no process uses any more.
//! - `unchanged`: what a change that changes nothing finds, and why it says so.

mod background;
pub mod bytecode;
pub mod dists;
pub mod gc;
mod listing;
pub mod manifest;
pub mod plan;
pub mod requirements;
pub mod spec;
mod unchanged;
pub mod uv;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OwnedMutexGuard;

use self::bytecode::{Bytecode, BytecodeError};
use self::dists::Dist;
pub use self::listing::{ListedDist, Listing};
use self::manifest::{Manifest, ManifestError};
use self::plan::{Change, Plan, PlanError};
use self::spec::SpecError;
pub use self::unchanged::{Prepare, Unchanged};
use self::uv::{InstallRequest, Uv, UvError};
use crate::config::Config;

/// Environment directories are named `env-<uuid v7>` (ordered by creation).
pub const ENV_PREFIX: &str = "env-";

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("a package change is already in progress; retry when it has finished")]
    Busy,
    #[error(
        "package management needs python.venv (the base environment new generations are built on)"
    )]
    NoBaseVenv,
    #[error(transparent)]
    Uv(#[from] UvError),
    #[error(transparent)]
    Bytecode(#[from] BytecodeError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{0} is not in the new environment after the install")]
    MissingAfterInstall(String),
    /// A requested distribution the installer skipped because its environment marker is
    /// false for the interpreter the workers run.
    #[error(
        "{requirement:?}: its environment marker `{marker}` is false for the service's Python environment, so nothing is installed for it; drop the marker (or the requirement). Nothing changed"
    )]
    MarkerExcludes { requirement: String, marker: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EnvError + '_ {
    move |source| EnvError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The package manager of one service.
pub struct EnvManager {
    envs_dir: PathBuf,
    uv: Uv,
    constraints: Option<PathBuf>,
    import_names: crate::config::ImportNames,
    /// The operator's venv and allowlist, before the managed overlay.
    base: Mutex<Base>,
    /// The committed state (what workers use once the last switch finished).
    manifest: Mutex<Manifest>,
    /// Held for the whole of one change: a second one is refused (409), never queued.
    change: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Debug, Clone)]
struct Base {
    venv: Option<PathBuf>,
    allowed: Vec<String>,
}

/// A built environment waiting for its rollover. Dropped without [`ChangeGuard::commit`],
/// its directory is deleted.
pub struct Prepared {
    pub dir: PathBuf,
    /// The live configuration with `python.venv` pointing at `dir` and the allowlist
    /// carrying the managed import names.
    pub config: Config,
    /// The modules the probe must import.
    pub probe_imports: Vec<String>,
    pub reason: String,
    /// The requested distributions whose import names were read, with their versions.
    pub changed: Vec<ListedDist>,
    /// The installer's and the compiler's time.
    pub install_time: Duration,
    pub bytecode: Bytecode,
    manifest: Manifest,
    committed: bool,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.committed {
            remove_env_dir(&self.dir);
        }
    }
}

/// Holds the change lock from planning to commit.
pub struct ChangeGuard {
    manager: Arc<EnvManager>,
    _lock: OwnedMutexGuard<()>,
}

impl EnvManager {
    /// Opens the managed state for `config` (as loaded) and, when a managed environment
    /// exists, points `config` at it (and says so in the log). Environment directories
    /// left over from earlier runs are deleted: no zygote runs yet.
    pub fn open(config: &mut Config) -> Result<Arc<Self>, EnvError> {
        let envs_dir = std::path::absolute(config.envs_dir()).map_err(io(Path::new(".")))?;
        let packages = &config.packages;
        let uv = Uv {
            binary: std::path::absolute(&packages.uv).unwrap_or_else(|_| packages.uv.clone()),
            cache_dir: packages
                .cache_dir
                .clone()
                .unwrap_or_else(|| envs_dir.join("uv-cache")),
            index_url: packages.index_url.trim().to_owned(),
            find_links: packages.find_links.clone(),
            only_binary: !packages.build_from_source,
            timeout: Duration::from_secs(packages.install_timeout_seconds),
        };
        let manifest = Manifest::load(&envs_dir)?;
        let manager = Arc::new(Self {
            envs_dir,
            uv,
            constraints: packages.constraints.clone(),
            import_names: packages.import_names.clone(),
            base: Mutex::new(Base {
                venv: None,
                allowed: Vec::new(),
            }),
            manifest: Mutex::new(manifest),
            change: Arc::default(),
        });
        let in_use = manager.overlay(config);
        if let Some(dir) = &in_use {
            tracing::info!(
                environment = %dir.display(),
                added = ?manager.manifest().requested.values().collect::<Vec<_>>(),
                "using the managed Python environment (packages added by the operator)"
            );
        }
        gc::remove_unused(
            &manager.envs_dir,
            gc::Sweep::AtStart {
                keep: in_use.as_deref(),
            },
        );
        Ok(manager)
    }

    /// Applies the managed environment to a configuration loaded from the file (at start-up
    /// and on reload): its venv and the added import names. Returns the managed
    /// environment now in use, if any.
    pub fn overlay(&self, config: &mut Config) -> Option<PathBuf> {
        let base_venv = config
            .python
            .venv
            .as_ref()
            .map(|v| std::path::absolute(v).unwrap_or_else(|_| v.clone()));
        *self.base.lock().unwrap() = Base {
            venv: base_venv.clone(),
            allowed: config.sandbox.allowed_packages.clone(),
        };
        let manifest = self.manifest();
        let dir = manifest.current_dir(&self.envs_dir)?;
        if manifest.base_venv != base_venv {
            tracing::warn!(
                built_on = ?manifest.base_venv,
                python_venv = ?base_venv,
                "the managed environment was built on another python.venv: not using it; \
                 the next package change rebuilds the added packages on the configured one"
            );
            return None;
        }
        if !dir.join("pyvenv.cfg").is_file() {
            tracing::warn!(environment = %dir.display(), "the managed environment is missing: using python.venv");
            return None;
        }
        config.python.venv = Some(dir.clone());
        extend_unique(
            &mut config.sandbox.allowed_packages,
            manifest.added_imports().cloned(),
        );
        Some(dir)
    }

    /// Whether the environment `live` runs on is the one `manifest` records (the managed
    /// one, built on the configured base venv; or the base venv itself, nothing added).
    fn serves(&self, manifest: &Manifest, base: &Base, live: &Config) -> bool {
        let live_venv = live
            .python
            .venv
            .as_ref()
            .map(|v| std::path::absolute(v).unwrap_or_else(|_| v.clone()));
        match manifest.current_dir(&self.envs_dir) {
            Some(dir) => manifest.base_venv == base.venv && live_venv == Some(dir),
            None => manifest.requested.is_empty() && live_venv == base.venv,
        }
    }

    /// The committed manifest.
    pub fn manifest(&self) -> Manifest {
        self.manifest.lock().unwrap().clone()
    }

    pub fn envs_dir(&self) -> &Path {
        &self.envs_dir
    }

    /// Starts a change: refused at once when another one is running.
    pub fn begin(self: &Arc<Self>) -> Result<ChangeGuard, EnvError> {
        let lock = self
            .change
            .clone()
            .try_lock_owned()
            .map_err(|_| EnvError::Busy)?;
        self.uv.check()?;
        Ok(ChangeGuard {
            manager: self.clone(),
            _lock: lock,
        })
    }
}

impl ChangeGuard {
    /// Builds the environment `change` asks for beside the one `live` runs on, unless the
    /// one `live` runs on already is that (see the module docs).
    pub async fn prepare(&self, change: &Change, live: &Config) -> Result<Prepare, EnvError> {
        let m = &self.manager;
        let base = m.base.lock().unwrap().clone();
        let base_venv = base.venv.clone().ok_or(EnvError::NoBaseVenv)?;
        let read = |venv: &Path| -> Result<Vec<Dist>, EnvError> {
            let site = site_packages(venv)?;
            dists::installed(&site).map_err(io(&site))
        };
        let base_dists = read(&base_venv)?;
        let current_dists = match &live.python.venv {
            Some(venv) => read(venv)?,
            None => base_dists.clone(),
        };
        let old = m.manifest();
        let plan = plan::plan(change, &old.requested, &base_dists, &current_dists)?;
        let serves_manifest = m.serves(&old, &base, live);
        if serves_manifest && plan.requested == old.requested {
            return Ok(Prepare::Unchanged(Unchanged {
                why: unchanged::already(change, &plan),
                install_time: Duration::ZERO,
                manifest: None,
            }));
        }

        std::fs::create_dir_all(&m.envs_dir).map_err(io(&m.envs_dir))?;
        let name = format!("{ENV_PREFIX}{}", uuid::Uuid::now_v7().simple());
        let dir = m.envs_dir.join(&name);
        let mut prepared = Prepared {
            dir: dir.clone(),
            config: live.clone(),
            probe_imports: Vec::new(),
            reason: change.describe(),
            changed: Vec::new(),
            install_time: Duration::ZERO,
            bytecode: Bytecode::default(),
            manifest: old.clone(),
            committed: false,
        };
        let started = Instant::now();
        let constraints_file = m.envs_dir.join(format!(".{name}.constraints.txt"));
        let result = self
            .install(&dir, &base_venv, &plan, &constraints_file)
            .await;
        let _ = std::fs::remove_file(&constraints_file);
        result?;
        prepared.install_time = started.elapsed();

        let new_dists = read(&dir)?;
        let mut manifest = Manifest {
            current: Some(name),
            base_venv: Some(base_venv),
            requested: plan.requested.clone(),
            import_names: Default::default(),
        };
        for dist_name in plan.requested.keys() {
            let dist = new_dists
                .iter()
                .find(|d| &d.name == dist_name)
                .ok_or_else(|| not_installed(dist_name, &plan))?;
            let names = match m.import_names.explicit_for(dist_name) {
                Some(names) => names.to_vec(),
                None if plan.probe.contains(dist_name) => dists::import_names(dist),
                // Unchanged: what it gave before.
                None => old
                    .import_names
                    .get(dist_name)
                    .cloned()
                    .unwrap_or_else(|| dists::import_names(dist)),
            };
            if plan.probe.contains(dist_name) {
                prepared.probe_imports.extend(names.iter().cloned());
                prepared.changed.push(ListedDist {
                    name: dist.name.clone(),
                    version: dist.version.clone(),
                    added: true,
                    requirement: plan.requested.get(dist_name).cloned(),
                    import_names: names.clone(),
                });
            }
            manifest.import_names.insert(dist_name.clone(), names);
        }
        prepared.manifest = manifest;
        prepared.config = self.next_config(&prepared, live);
        let mut as_serving = prepared.config.clone();
        as_serving.python.venv = live.python.venv.clone();
        if serves_manifest
            && unchanged::same_dists(&new_dists, &current_dists)
            && crate::config::same_settings(&as_serving, live)
        {
            // `prepared` is dropped: its directory goes.
            let manifest = Manifest {
                current: old.current.clone(),
                base_venv: old.base_venv.clone(),
                requested: prepared.manifest.requested.clone(),
                import_names: prepared.manifest.import_names.clone(),
            };
            return Ok(Prepare::Unchanged(Unchanged {
                why: format!(
                    "the requirements resolve to the {} distributions already installed, at                      the same versions",
                    new_dists.len()
                ),
                install_time: prepared.install_time,
                manifest: (manifest != old).then_some(manifest),
            }));
        }
        // Only for an environment that will serve: the one above is deleted uncompiled.
        let serving_site = live.python.venv.as_deref().and_then(dists::site_packages);
        prepared.bytecode = bytecode::compile(
            &dir.join("bin").join("python"),
            &site_packages(&dir)?,
            serving_site.as_deref(),
            m.uv.timeout,
        )
        .await?;
        prepared.install_time = started.elapsed();
        Ok(Prepare::Built(Box::new(prepared)))
    }

    /// Records a change that left the environment as it was (new requirement texts, if
    /// any); the serving generation stays.
    pub fn keep(&self, unchanged: Unchanged) -> Result<(), EnvError> {
        let m = &self.manager;
        if let Some(manifest) = unchanged.manifest {
            manifest.save(&m.envs_dir)?;
            *m.manifest.lock().unwrap() = manifest;
        }
        Ok(())
    }

    /// The configuration `prepared` rolls over to: `live` (re-read just before the switch,
    /// so a reload that finished meanwhile is kept) on the new environment, its allowlist
    /// the operator's own plus what the added distributions provide.
    pub fn next_config(&self, prepared: &Prepared, live: &Config) -> Config {
        let base = self.manager.base.lock().unwrap().clone();
        let mut next = live.clone();
        let mut allowed = base.allowed;
        extend_unique(&mut allowed, prepared.manifest.added_imports().cloned());
        next.sandbox.allowed_packages = allowed;
        next.python.venv = Some(prepared.dir.clone());
        next
    }

    async fn install(
        &self,
        dir: &Path,
        base_venv: &Path,
        plan: &Plan,
        constraints_file: &Path,
    ) -> Result<(), EnvError> {
        let m = &self.manager;
        m.uv.venv(dir, &base_venv.join("bin").join("python"))
            .await?;
        std::fs::write(constraints_file, plan.constraints.join("\n") + "\n")
            .map_err(io(constraints_file))?;
        let mut constraint_files = vec![constraints_file];
        if let Some(file) = &m.constraints {
            constraint_files.push(file);
        }
        let request = InstallRequest {
            requirements: plan.requirements.clone(),
            constraint_files,
        };
        m.uv.install(&dir.join("bin").join("python"), &request)
            .await?;
        Ok(())
    }

    /// Records `prepared` as the current environment once workers have switched to it,
    /// and deletes environment directories no process uses any more.
    pub fn commit(&self, mut prepared: Prepared) -> Result<(), EnvError> {
        let m = &self.manager;
        prepared.manifest.save(&m.envs_dir)?;
        prepared.committed = true;
        *m.manifest.lock().unwrap() = prepared.manifest.clone();
        tokio::spawn(gc::sweep_after_switch(
            m.envs_dir.clone(),
            prepared.dir.clone(),
        ));
        Ok(())
    }
}

/// The site-packages directory of the venv at `venv`, which must have one.
fn site_packages(venv: &Path) -> Result<PathBuf, EnvError> {
    dists::site_packages(venv).ok_or_else(|| EnvError::Io {
        path: venv.join("lib"),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no site-packages"),
    })
}

/// Why the requested `name` is not in the environment uv built: its marker excludes the
/// workers' interpreter (the operator's to fix), or something went wrong.
fn not_installed(name: &str, plan: &Plan) -> EnvError {
    let requirement = plan.requested.get(name);
    match requirement.and_then(|text| spec::marker(text)) {
        Some(marker) => EnvError::MarkerExcludes {
            requirement: requirement.cloned().unwrap_or_default(),
            marker,
        },
        None => EnvError::MissingAfterInstall(name.to_owned()),
    }
}

fn extend_unique(list: &mut Vec<String>, more: impl Iterator<Item = String>) {
    let mut seen: BTreeSet<String> = list.iter().cloned().collect();
    for name in more {
        if seen.insert(name.clone()) {
            list.push(name);
        }
    }
}

/// Deletes an environment directory, logging (not failing) when it cannot.
pub(crate) fn remove_env_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => tracing::debug!(environment = %dir.display(), "environment removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(environment = %dir.display(), error = %e, "cannot remove an environment")
        }
    }
}
