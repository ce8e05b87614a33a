//! Configuration: defaults, then a TOML file, then `SNAKECAGE_*` environment variables,
//! then command-line flags; validated once at start-up.
//!
//! Environment variables name nested keys with `__`: `SNAKECAGE_POOL__SIZE=8`,
//! `SNAKECAGE_LIMITS__MEMORY_LIMIT_MB=512`, `SNAKECAGE_LISTEN=0.0.0.0:8000`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use snakecage_worker::protocol::{Layer, SandboxConfig};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    pub pool: PoolConfig,
    pub limits: LimitsConfig,
    pub python: PythonConfig,
    pub worker: WorkerConfig,
    pub files: FilesConfig,
    pub workspace: WorkspaceConfig,
    pub sessions: SessionsConfig,
    pub mcp: McpConfig,
    pub auth: AuthConfig,
    pub sandbox: SandboxSettings,
    pub log: LogConfig,
}

/// API keys (README, "Authentication"). Without any, every route is open: the service is
/// then for local use and refuses to listen beyond loopback unless `allow_unauthenticated`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// A TOML file of `[[keys]]` (what `snakecage keys add` writes).
    pub keys_file: Option<PathBuf>,
    /// Keys given inline, as `[[auth.keys]]` tables like those of the keys file.
    pub keys: Vec<crate::auth::KeyEntry>,
    /// Whether `/metrics` answers without a key.
    pub public_metrics: bool,
    /// Whether the status page (`/`, `/v1/status`) answers without a key.
    pub public_status: bool,
    /// Listen beyond loopback without keys (`--allow-unauthenticated`): anyone who can
    /// reach the port runs code and reads every file.
    pub allow_unauthenticated: bool,
}

/// The MCP endpoint at `/mcp`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// `Host` header values `/mcp` answers (a defence against DNS rebinding); add the names
    /// clients use when the service is reachable beyond loopback.
    pub allowed_hosts: Vec<String>,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            allowed_hosts: ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Idle, pre-forked workers kept ready. Default: 2 × cores.
    pub size: usize,
    /// Requests that may wait for a worker; one more gets 429.
    pub queue_length: usize,
    /// A request that waited this long for a worker gets 503.
    pub queue_timeout_ms: u64,
    /// How long a new worker may take to become ready.
    pub spawn_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// `timeout_ms` when the request does not give one.
    pub default_timeout_ms: u64,
    /// Largest `timeout_ms` a request may ask for.
    pub max_timeout_ms: u64,
    /// Memory a job may allocate on top of the preloaded interpreter.
    pub memory_limit_mb: u64,
    /// Per stream (stdout, stderr); the rest is cut with `\n...[truncated]`.
    pub max_output_bytes: usize,
    /// Largest request body.
    pub max_request_bytes: usize,
    /// Largest file a job may write (RLIMIT_FSIZE).
    pub max_file_size_mb: u64,
    /// RLIMIT_NOFILE for workers.
    pub max_open_files: u64,
    /// The largest rich output (one MIME bundle of a run's `results`); a bigger one is
    /// replaced by a note saying so.
    pub max_bundle_bytes: u64,
    /// RLIMIT_NPROC for workers: processes and threads of the worker uid, counted over all
    /// workers together (they share the uid). Stops thread bombs; leave room for
    /// `pool.size` × 2 workers plus the threads a job may legitimately start.
    pub max_processes: u64,
}

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
    /// Imported once in the zygote; those that are not installed are skipped and reported.
    pub preload: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// The zygote binary; default: `snakecage-worker` next to this executable.
    pub binary: Option<PathBuf>,
    /// Where per-worker workspaces and the zygote's caches live.
    pub state_dir: PathBuf,
    /// In-flight requests get this long to finish on shutdown before workers are killed.
    pub shutdown_grace_ms: u64,
    /// On shutdown, `/ready` answers 503 for this long while requests are still served,
    /// so load balancers stop sending before the listener closes (0: close at once).
    pub shutdown_drain_ms: u64,
}

/// The file store: uploads and the files runs write.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesConfig {
    /// Where stored files and their metadata live; default: `files` under
    /// `worker.state_dir`. Unlike the workspaces it is kept at shutdown, so files survive a
    /// restart.
    pub dir: Option<PathBuf>,
    /// Largest upload (and largest file a run may leave behind to be stored).
    pub max_file_size_mb: u64,
    /// Stored files are deleted this long after they were stored; 0 keeps them.
    pub ttl_seconds: u64,
    /// Total size of all stored files; a store that would grow past it answers 507.
    /// 0 means no quota.
    pub quota_mb: u64,
}

/// The per-run workspace directories.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkspaceConfig {
    /// Parent of the per-worker workspaces; default: `/dev/shm/snakecage` when /dev/shm is
    /// a tmpfs of at least 1 GiB, else `worker.state_dir`. Removed at shutdown.
    pub dir: Option<PathBuf>,
    /// The most a run's new and changed files may add up to; what is beyond it is not
    /// stored (each single file is also bounded by `limits.max_file_size_mb`).
    pub max_total_mb: u64,
    /// The most workspace entries (files and directories) looked at after a run.
    pub max_entries: usize,
}

/// Stateful Python sessions (`/v1/sessions`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// A session unused this long is deleted, unless it was created with its own
    /// `ttl_seconds`.
    pub idle_timeout_seconds: u64,
    /// Sessions that may exist at once; creating one more evicts the least recently used.
    pub max_sessions: usize,
    /// The largest `ttl_seconds` a session may ask for.
    pub max_ttl_seconds: u64,
    /// After an overdue session job is interrupted (SIGINT ⇒ `KeyboardInterrupt`), how long
    /// the worker has to answer before it is killed and the session is lost.
    pub interrupt_grace_ms: u64,
}

/// The isolation layers (SECURITY.md describes each one).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    /// Layers that must be active: start-up fails if one of them is not.
    pub require: Vec<Layer>,
    /// Layers switched off, for benchmarking only; every one is logged as a warning.
    pub layers_off: Vec<Layer>,
    /// The unprivileged uid and gid workers drop to when the service runs as root.
    pub uid: u32,
    pub gid: u32,
    /// Third-party top-level packages user code may import (the standard library ones are
    /// in `python-stdlib-allowlist`).
    pub allowed_packages: Vec<String>,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        let defaults = SandboxConfig::default();
        Self {
            require: Vec::new(),
            layers_off: Vec::new(),
            uid: defaults.uid,
            gid: defaults.gid,
            allowed_packages: defaults.allowed_packages,
        }
    }
}

impl SandboxSettings {
    /// What the zygote is told.
    pub fn zygote_config(&self) -> SandboxConfig {
        SandboxConfig {
            uid: self.uid,
            gid: self.gid,
            layers_off: self.layers_off.clone(),
            allowed_packages: self.allowed_packages.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A `tracing` filter, e.g. `info` or `snakecage=debug`. `RUST_LOG` overrides it.
    pub level: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            pool: PoolConfig::default(),
            limits: LimitsConfig::default(),
            python: PythonConfig::default(),
            worker: WorkerConfig::default(),
            files: FilesConfig::default(),
            workspace: WorkspaceConfig::default(),
            sessions: SessionsConfig::default(),
            mcp: McpConfig::default(),
            auth: AuthConfig::default(),
            sandbox: SandboxSettings::default(),
            log: LogConfig::default(),
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            keys_file: None,
            keys: Vec::new(),
            public_metrics: true,
            public_status: false,
            allow_unauthenticated: false,
        }
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            size: 2 * cores,
            queue_length: 256,
            queue_timeout_ms: 30_000,
            spawn_timeout_ms: 30_000,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            default_timeout_ms: 2_000,
            max_timeout_ms: 60_000,
            memory_limit_mb: 256,
            max_output_bytes: 1_000_000,
            max_request_bytes: 10 << 20,
            max_file_size_mb: 100,
            max_open_files: 256,
            max_bundle_bytes: 2 << 20,
            max_processes: 512,
        }
    }
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            idle_timeout_seconds: 1800,
            max_sessions: 64,
            max_ttl_seconds: 86_400,
            interrupt_grace_ms: 2_000,
        }
    }
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            venv: Some(PathBuf::from(".venv")),
            home: None,
            site_packages: Vec::new(),
            preload: ["numpy", "pandas", "matplotlib", "matplotlib.pyplot"]
                .map(String::from)
                .to_vec(),
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            binary: None,
            state_dir: std::env::temp_dir().join("snakecage"),
            shutdown_grace_ms: 10_000,
            shutdown_drain_ms: 0,
        }
    }
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            dir: None,
            max_file_size_mb: 100,
            ttl_seconds: 3600,
            quota_mb: 10 << 10,
        }
    }
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        Self {
            dir: None,
            max_total_mb: 500,
            max_entries: 10_000,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}

/// Values given on the command line; each one that is set overrides every other source.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Overrides {
    /// Address to listen on, e.g. 127.0.0.1:8000.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Virtualenv with the packages user code may import.
    #[arg(long = "venv")]
    pub venv: Option<PathBuf>,
    /// Idle workers kept ready.
    #[arg(long = "pool-size")]
    pub pool_size: Option<usize>,
    /// Log format.
    #[arg(long = "log-format", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Serve beyond loopback without API keys (anyone who reaches the port can run code).
    #[arg(
        long = "allow-unauthenticated",
        env = "SNAKECAGE_ALLOW_UNAUTHENTICATED",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_unauthenticated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads defaults < `file` < environment < `overrides`, then validates.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.is_file() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} not found",
                    file.display()
                )));
            }
            fig = fig.merge(Toml::file(file));
        }
        fig = fig.merge(
            Env::prefixed("SNAKECAGE_")
                .split("__")
                .ignore(&["config", "allow_unauthenticated"]),
        );
        if let Some(listen) = overrides.listen {
            fig = fig.merge(Serialized::default("listen", listen));
        }
        if let Some(venv) = &overrides.venv {
            fig = fig.merge(Serialized::default("python.venv", venv));
        }
        if let Some(size) = overrides.pool_size {
            fig = fig.merge(Serialized::default("pool.size", size));
        }
        if let Some(format) = overrides.log_format {
            fig = fig.merge(Serialized::default("log.format", format));
        }
        if overrides.allow_unauthenticated {
            fig = fig.merge(Serialized::default("auth.allow_unauthenticated", true));
        }
        let config: Config = fig.extract().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |msg: &str| Err(ConfigError::Invalid(msg.to_owned()));
        if self.pool.size == 0 {
            return bad("pool.size must be at least 1");
        }
        if self.limits.default_timeout_ms == 0 || self.limits.max_timeout_ms == 0 {
            return bad("limits.default_timeout_ms and limits.max_timeout_ms must be positive");
        }
        if self.limits.default_timeout_ms > self.limits.max_timeout_ms {
            return bad("limits.default_timeout_ms must not exceed limits.max_timeout_ms");
        }
        if self.limits.memory_limit_mb == 0 {
            return bad("limits.memory_limit_mb must be positive");
        }
        if self.limits.max_open_files < 16 {
            return bad("limits.max_open_files must be at least 16 (CPython needs a few)");
        }
        if self.files.max_file_size_mb == 0 {
            return bad("files.max_file_size_mb must be positive");
        }
        if self.workspace.max_entries == 0 {
            return bad("workspace.max_entries must be at least 1");
        }
        if self.sessions.idle_timeout_seconds == 0 || self.sessions.max_ttl_seconds == 0 {
            return bad(
                "sessions.idle_timeout_seconds and sessions.max_ttl_seconds must be positive",
            );
        }
        if self.sessions.max_sessions == 0 {
            return bad("sessions.max_sessions must be at least 1");
        }
        if self.limits.max_bundle_bytes < 1024 {
            return bad("limits.max_bundle_bytes must be at least 1024");
        }
        if self.limits.max_processes < 2 * self.pool.size as u64 {
            return bad("limits.max_processes must be at least 2 × pool.size (workers share it)");
        }
        if let Some(layer) = self
            .sandbox
            .require
            .iter()
            .find(|l| self.sandbox.layers_off.contains(l))
        {
            return Err(ConfigError::Invalid(format!(
                "sandbox layer {} is both required and switched off",
                layer.as_str()
            )));
        }
        if self.sandbox.uid == 0 || self.sandbox.gid == 0 {
            return bad("sandbox.uid and sandbox.gid must not be 0 (root)");
        }
        Ok(())
    }

    /// Where stored files live.
    pub fn files_dir(&self) -> PathBuf {
        self.files
            .dir
            .clone()
            .unwrap_or_else(|| self.worker.state_dir.join("files"))
    }

    /// The parent of this process's workspaces.
    pub fn workspace_root(&self) -> PathBuf {
        let base = match &self.workspace.dir {
            Some(dir) => dir.clone(),
            None => default_workspace_base().unwrap_or_else(|| self.worker.state_dir.clone()),
        };
        base.join(format!("workspaces-{}", std::process::id()))
    }

    /// The zygote binary to exec.
    pub fn worker_binary(&self) -> PathBuf {
        if let Some(bin) = &self.worker.binary {
            return bin.clone();
        }
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = exe.parent().unwrap_or(Path::new("."));
        // Integration tests and benches run from target/<profile>/deps.
        let sibling = dir.join("snakecage-worker");
        if !sibling.exists() && dir.ends_with("deps") {
            return dir.parent().unwrap_or(dir).join("snakecage-worker");
        }
        sibling
    }
}

/// `/dev/shm/snakecage` when /dev/shm is a tmpfs of at least 1 GiB: creating and
/// removing a workspace per request there costs no disk metadata work (on ext4 it showed
/// up in the supervisor's profile). Smaller ones (containers default to 64 MiB) would not
/// hold staged files, so they are not used by default.
fn default_workspace_base() -> Option<PathBuf> {
    const MIN_BYTES: u64 = 1 << 30;
    let stat = nix::sys::statvfs::statvfs("/dev/shm").ok()?;
    let total = stat.blocks() as u64 * stat.fragment_size() as u64;
    let is_tmpfs = nix::sys::statfs::statfs("/dev/shm")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    (is_tmpfs && total >= MIN_BYTES).then(|| PathBuf::from("/dev/shm/snakecage"))
}

/// Where the Python side lives, resolved from [`PythonConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonLayout {
    pub home: Option<PathBuf>,
    pub site_packages: Vec<PathBuf>,
}

impl PythonConfig {
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
    fn pyvenv_home_is_the_prefix_above_bin() {
        let cfg = "home = /opt/py/3.11.7/bin\ninclude-system-site-packages = false\n";
        assert_eq!(venv_home(cfg), Some(PathBuf::from("/opt/py/3.11.7")));
        assert_eq!(venv_home("version = 3.11\n"), None);
    }

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.limits.default_timeout_ms, 2000);
        assert_eq!(c.limits.max_timeout_ms, 60_000);
        assert_eq!(c.limits.max_output_bytes, 1_000_000);
        assert_eq!(c.limits.memory_limit_mb, 256);
        assert_eq!(c.files.max_file_size_mb, 100);
        assert_eq!(c.files.ttl_seconds, 3600);
        assert_eq!(c.files_dir(), c.worker.state_dir.join("files"));
        assert_eq!(c.sessions.idle_timeout_seconds, 1800);
        assert_eq!(c.sessions.max_sessions, 64);
        assert_eq!(c.sessions.max_ttl_seconds, 86_400);
    }

    #[test]
    fn sandbox_layers_are_read_by_name_and_contradictions_rejected() {
        let dir = std::env::temp_dir().join(format!("snakecage-sandbox-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "[python]\nvenv = \"/nope\"\n[sandbox]\nrequire = [\"landlock\", \"seccomp\"]\nlayers_off = [\"audit_hook\"]\nuid = 1234\n",
        )
        .unwrap();
        let c = Config::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.sandbox.require, vec![Layer::Landlock, Layer::Seccomp]);
        assert_eq!(c.sandbox.layers_off, vec![Layer::AuditHook]);
        assert_eq!((c.sandbox.uid, c.sandbox.gid), (1234, 65534));
        let z = c.sandbox.zygote_config();
        assert!(!z.wants(Layer::AuditHook) && z.wants(Layer::Seccomp));
        std::fs::write(&file, "[sandbox]\nlayers_off = [\"firewall\"]\n").unwrap();
        assert!(matches!(
            Config::load(Some(&file), &Overrides::default()),
            Err(ConfigError::Load(_))
        ));
        std::fs::write(
            &file,
            "[sandbox]\nrequire = [\"seccomp\"]\nlayers_off = [\"seccomp\"]\n",
        )
        .unwrap();
        assert!(matches!(
            Config::load(Some(&file), &Overrides::default()),
            Err(ConfigError::Invalid(m)) if m.contains("both required and switched off")
        ));
        std::fs::write(&file, "[sandbox]\nuid = 0\n").unwrap();
        assert!(matches!(
            Config::load(Some(&file), &Overrides::default()),
            Err(ConfigError::Invalid(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_then_overrides_take_precedence() {
        let dir = std::env::temp_dir().join(format!("snakecage-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9000\"\n[pool]\nsize = 3\n[python]\nvenv = \"/nope\"\n",
        )
        .unwrap();
        let c = Config::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!((c.listen.port(), c.pool.size), (9000, 3));
        let over = Overrides {
            pool_size: Some(5),
            listen: Some("127.0.0.1:9100".parse().unwrap()),
            ..Default::default()
        };
        let c = Config::load(Some(&file), &over).unwrap();
        assert_eq!((c.listen.port(), c.pool.size), (9100, 5));
        std::fs::write(&file, "[pool]\nsize = 0\n").unwrap();
        assert!(matches!(
            Config::load(Some(&file), &Overrides::default()),
            Err(ConfigError::Invalid(_))
        ));
        std::fs::write(&file, "[pool]\nsise = 2\n").unwrap();
        assert!(matches!(
            Config::load(Some(&file), &Overrides::default()),
            Err(ConfigError::Load(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_example_config_parses_and_states_the_defaults() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("snakecage.example.toml");
        let loaded = Config::load(Some(&example), &Overrides::default()).unwrap();
        let as_json = |c: &Config| serde_json::to_value(c).unwrap();
        assert_eq!(as_json(&loaded), as_json(&Config::default()));

        // Every key is documented there, set or commented out, under its own section.
        let text = std::fs::read_to_string(&example).unwrap();
        let mut section = String::new();
        let mut documented = std::collections::BTreeSet::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
            } else if let Some((key, _)) = line.trim_start_matches("# ").split_once(" = ") {
                documented.insert(if section.is_empty() {
                    key.to_owned()
                } else {
                    format!("{section}.{key}")
                });
            }
        }
        let serde_json::Value::Object(defaults) = as_json(&Config::default()) else {
            unreachable!()
        };
        for (name, value) in defaults {
            let keys: Vec<String> = match value {
                serde_json::Value::Object(table) => {
                    table.keys().map(|k| format!("{name}.{k}")).collect()
                }
                _ => vec![name],
            };
            for key in keys {
                assert!(
                    documented.contains(&key),
                    "snakecage.example.toml does not document {key}"
                );
            }
        }
    }
}
