//! Configuration: defaults, then a TOML file, then `SNAKECAGE_*` environment variables,
//! then command-line flags; validated once at start-up.
//!
//! Environment variables name nested keys with `__`: `SNAKECAGE_POOL__SIZE=8`,
//! `SNAKECAGE_LIMITS__MEMORY_LIMIT_MB=512`, `SNAKECAGE_LISTEN=0.0.0.0:8000`.
//!
//! - [`sections`]: one struct per `[section]` of the file, with its defaults.
//! - [`python`]: where the interpreter and its packages live (`[python]`, venv layout).
//! - [`tiers`]: the zygote tiers and their preload profiles (`[tiers]`).
//! - [`s3`]: the file store backend (`files.backend`) and the object store (`[s3]`).
//! - [`cluster`]: this replica's id and its peers (`[cluster]`).
//! - [`reload`]: which keys a running service can take without a restart.
//! - [`shadowed`]: the file's settings that a variable or a flag overrides.
//! - [`explain`]: what a `--config` path or a `listen` address that cannot work is.
//! - [`minimums`]: the least value of each numeric key the service can work with.
//! - [`tools`]: Code Mode: tool call limits and the operator's tools (`[tools]`).
//! - [`packages`]: operator package management: installer, environment generations (`[packages]`).
//!
//! A new area of configuration gets a file of its own here and one field in [`Config`].

mod cluster;
mod explain;
mod minimums;
mod packages;
mod python;
mod reload;
mod s3;
mod sections;
mod shadowed;
mod tiers;
mod tools;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

pub use self::cluster::{ClusterConfig, valid_replica_id};
pub use self::explain::LISTEN_HINT;
use self::explain::{check_config_file, explain_load_error, parse_listen};
pub use self::packages::{ImportNames, PackagesConfig, normalize_dist_name};
pub use self::python::{PythonConfig, PythonLayout};
pub use self::reload::{RELOADABLE, same_settings, unreloadable_changes};
pub use self::s3::{FilesBackend, S3Config};
pub use self::sections::*;
pub use self::shadowed::shadowed_settings;
pub use self::tiers::{TierProfile, TiersConfig};
pub use self::tools::{HttpToolConfig, McpServerConfig, ToolsConfig, needs_tls};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    pub pool: PoolConfig,
    pub limits: LimitsConfig,
    pub python: PythonConfig,
    pub tiers: TiersConfig,
    pub worker: WorkerConfig,
    pub files: FilesConfig,
    pub workspace: WorkspaceConfig,
    pub sessions: SessionsConfig,
    pub mcp: McpConfig,
    pub tools: ToolsConfig,
    pub auth: AuthConfig,
    pub sandbox: SandboxSettings,
    pub log: LogConfig,
    pub s3: S3Config,
    pub cluster: ClusterConfig,
    pub packages: PackagesConfig,
    /// Where this configuration was read from (not a key): a reload reads it again.
    #[serde(skip)]
    pub source: ConfigSource,
}

/// The sources a configuration was loaded from: the file and the command-line flags (the
/// environment is read again as it is).
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    pub file: Option<PathBuf>,
    pub overrides: Overrides,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            pool: PoolConfig::default(),
            limits: LimitsConfig::default(),
            python: PythonConfig::default(),
            tiers: TiersConfig::default(),
            worker: WorkerConfig::default(),
            files: FilesConfig::default(),
            workspace: WorkspaceConfig::default(),
            sessions: SessionsConfig::default(),
            mcp: McpConfig::default(),
            tools: ToolsConfig::default(),
            auth: AuthConfig::default(),
            sandbox: SandboxSettings::default(),
            log: LogConfig::default(),
            s3: S3Config::default(),
            cluster: ClusterConfig::default(),
            packages: PackagesConfig::default(),
            source: ConfigSource::default(),
        }
    }
}

/// Values given on the command line; each one that is set overrides every other source.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Overrides {
    /// Address to listen on, e.g. 127.0.0.1:8000.
    #[arg(long, value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// Virtualenv with the packages user code may import.
    #[arg(long = "venv")]
    pub venv: Option<PathBuf>,
    /// Jobs that run at once, and idle pre-forked workers kept ready (pool.size; default
    /// 2 x cores).
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

/// The prefix of the environment variables that set configuration keys.
const ENV_PREFIX: &str = "SNAKECAGE_";
/// `SNAKECAGE_*` variables that are not configuration keys (flags' and clients' own).
const ENV_IGNORED: &[&str] = &["config", "allow_unauthenticated", "api_key"];

/// The uid `sandbox.uid` named when it was the one uid every worker ran as (nobody),
/// before each worker had a uid of its own from a range.
const NOBODY: u32 = 65_534;

/// The largest `limits.max_total_memory_mb`: 2^53 bytes, far past any machine, well
/// inside the kernel's page counter.
pub const MAX_TOTAL_MEMORY_MB: u64 = 1 << 33;

/// The largest `pool.size`: jobs at once, each with a worker and as many idle ones kept
/// ready; far past what a host runs at once (the default is 2 × cores), and within what
/// the supervisor's descriptors and the worker uids of a range hold.
pub const MAX_POOL_SIZE: usize = 1024;

/// The largest `limits.max_total_processes`: `PID_MAX_LIMIT` of a 64-bit kernel, the most
/// pids it ever counts.
pub const MAX_TOTAL_PROCESSES: u64 = 4_194_304;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {}", explain::load_error_text(.0))]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads defaults < `file` < environment < `overrides`, then validates.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            check_config_file(file)?;
            fig = fig.merge(Toml::file(file));
        }
        fig = fig.merge(Env::prefixed(ENV_PREFIX).split("__").ignore(ENV_IGNORED));
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
        let mut config: Config = fig.extract().map_err(explain_load_error)?;
        config.source = ConfigSource {
            file: file.map(Path::to_path_buf),
            overrides: overrides.clone(),
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads the same sources again (file, environment, flags): what a reload runs with.
    pub fn reload(&self) -> Result<Self, ConfigError> {
        Self::load(self.source.file.as_deref(), &self.source.overrides)
    }

    /// The first directory key whose path cannot be one: it holds a NUL byte (no system
    /// call takes it), or names something that is not a directory. A directory that does
    /// not exist yet is fine (the service makes it), and `python.home`, which nothing
    /// makes, must exist. Named here, before start-up fails deeper down without the key.
    fn directory_problem(&self) -> Option<String> {
        let keys: [(&str, Option<&std::path::Path>, bool); 6] = [
            ("worker.state_dir", Some(&self.worker.state_dir), false),
            ("workspace.dir", self.workspace.dir.as_deref(), false),
            ("files.dir", self.files.dir.as_deref(), false),
            (
                "packages.envs_dir",
                self.packages.envs_dir.as_deref(),
                false,
            ),
            (
                "packages.cache_dir",
                self.packages.cache_dir.as_deref(),
                false,
            ),
            ("python.home", self.python.home.as_deref(), true),
        ];
        keys.into_iter().find_map(|(key, path, must_exist)| {
            let path = path?;
            let shown = path.display().to_string().escape_debug().to_string();
            if path.as_os_str().as_encoded_bytes().contains(&0) {
                return Some(format!(
                    "{key} \"{shown}\" holds a NUL byte, which no path can: give a directory"
                ));
            }
            let what = match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => return None,
                Ok(_) => "is not a directory",
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => return None,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist",
                // On the way to it, a file where a directory should be (ENOTDIR).
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                    "has a file, not a directory, on its way"
                }
                Err(_) => return None,
            };
            Some(format!("{key} \"{shown}\" {what}: give a directory"))
        })
    }

    /// Checks the values together (ranges, consistency); [`Config::load`] calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |msg: &str| Err(ConfigError::Invalid(msg.to_owned()));
        self.log.check_level().map_err(ConfigError::Invalid)?;
        if self.pool.size == 0 {
            return bad("pool.size must be at least 1");
        }
        if self.pool.size > MAX_POOL_SIZE {
            return Err(ConfigError::Invalid(format!(
                "pool.size is {} but may be at most {MAX_POOL_SIZE}: it is the jobs that run at \
                 once (each on a worker, with as many idle ones kept ready), and the default is \
                 2 × the host's cores; more jobs can wait in pool.queue_length",
                self.pool.size
            )));
        }
        if self.limits.default_timeout_ms == 0 || self.limits.max_timeout_ms == 0 {
            return bad("limits.default_timeout_ms and limits.max_timeout_ms must be positive");
        }
        if self.limits.default_timeout_ms > self.limits.max_timeout_ms {
            return bad("limits.default_timeout_ms must not exceed limits.max_timeout_ms");
        }
        if self.limits.max_timeout_ms > sections::MAX_TIMEOUT_CEILING_MS {
            return Err(ConfigError::Invalid(format!(
                "limits.max_timeout_ms is {} but may be at most {} (10 minutes); a longer job \
                 belongs in a session run in steps",
                self.limits.max_timeout_ms,
                sections::MAX_TIMEOUT_CEILING_MS
            )));
        }
        let one_run = self.limits.cpu_seconds();
        let life = self.limits.max_session_cpu_seconds;
        if !(one_run..=sections::MAX_SESSION_CPU_SECONDS).contains(&life) {
            return Err(ConfigError::Invalid(format!(
                "limits.max_session_cpu_seconds is {life} but must be from {one_run} \
                 (limits.max_timeout_ms and a second: one run's CPU-time budget) to {} (a day)",
                sections::MAX_SESSION_CPU_SECONDS
            )));
        }
        if self.limits.memory_limit_mb == 0 {
            return bad("limits.memory_limit_mb must be positive");
        }
        let client = self.limits.client_timeout_ms;
        if !(sections::MIN_CLIENT_TIMEOUT_MS..=sections::MAX_CLIENT_TIMEOUT_MS).contains(&client) {
            return Err(ConfigError::Invalid(format!(
                "limits.client_timeout_ms is {client} but must be from {} (a second) to {} (an \
                 hour): how long a client may take to send a request's headers, and may let \
                 its request body stall",
                sections::MIN_CLIENT_TIMEOUT_MS,
                sections::MAX_CLIENT_TIMEOUT_MS
            )));
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
        if self.workspace.max_files == 0 {
            return bad("workspace.max_files must be at least 1");
        }
        if !(1..=100).contains(&self.files.key_share_percent) {
            return Err(ConfigError::Invalid(format!(
                "files.key_share_percent is {} but must be from 1 to 100 (the percentage of \
                 files.quota_mb an API key without max_stored_mb may hold; 100: all of it)",
                self.files.key_share_percent
            )));
        }
        if self.sessions.idle_timeout_seconds == 0 || self.sessions.max_ttl_seconds == 0 {
            return bad(
                "sessions.idle_timeout_seconds and sessions.max_ttl_seconds must be positive",
            );
        }
        if self.sessions.max_sessions == 0 {
            return bad("sessions.max_sessions must be at least 1");
        }
        if let Some(problem) = self.python.problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if let Some(problem) = self.directory_problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if let Some(problem) = minimums::problem(self) {
            return Err(ConfigError::Invalid(problem));
        }
        if self.limits.max_bundle_bytes < 1024 {
            return bad("limits.max_bundle_bytes must be at least 1024");
        }
        let threads = u64::from(self.tools.max_concurrent_calls) + 16;
        if self.limits.max_processes < threads {
            return Err(ConfigError::Invalid(format!(
                "limits.max_processes is {} but must be at least {threads} (tools.max_concurrent_calls + 16): it bounds one worker's threads, and each tool call in flight has one",
                self.limits.max_processes
            )));
        }
        if let Some(problem) = self.total_processes_problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if let Some(problem) = self.total_memory_problem() {
            return Err(ConfigError::Invalid(problem));
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
        if self.sandbox.uid == Some(0) || self.sandbox.gid == 0 {
            return bad("sandbox.uid and sandbox.gid must not be 0 (root)");
        }
        if self.sandbox.uid == Some(NOBODY) {
            return Err(ConfigError::Invalid(format!(
                "sandbox.uid = {NOBODY}: sandbox.uid no longer names the one uid every worker runs as (nobody); it is now the first id of a range of sandbox.uid_count ids, one per worker, and {NOBODY} is nobody's own: remove sandbox.uid (each worker then takes a uid of its own from a free block of {}–{}), or set it to the first id of a range that holds no account's id; sandbox.gid stays the group every worker runs as",
                crate::pool::uids::AUTO_FIRST,
                crate::pool::uids::AUTO_LAST
            )));
        }
        if let Some(problem) = self.uid_range_problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if self.files.backend == FilesBackend::S3
            && let Some(problem) = self.s3.problem()
        {
            return Err(ConfigError::Invalid(problem));
        }
        if let Some(problem) = self.cluster.problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if let Some(problem) = self.packages.problem() {
            return Err(ConfigError::Invalid(problem));
        }
        self.tools.validate().map_err(ConfigError::Invalid)?;
        self.tiers.validate()
    }

    /// The most workers that can be alive at once, each with a uid of its own: a worker
    /// per session; the stateless runs of every slot, and as many just killed and not yet
    /// reaped; every tier's idle workers (`pool.size` spread by demand, `tiers.min_idle`
    /// each, one of margin before the idle are retired and one warmed to replace a cold
    /// one), twice over while a rollover stocks the next generation beside the serving
    /// one; and a rollover's probe worker per tier.
    pub fn most_workers(&self) -> u64 {
        let size = self.pool.size as u64;
        let tiers = self.tiers.profile.len() as u64;
        let idle = size + tiers * (self.tiers.min_idle as u64 + 2);
        self.sessions.max_sessions as u64 + 2 * size + 2 * idle + tiers
    }

    /// `limits.max_total_processes`, or the default: eight threads for every worker that
    /// can be alive at once ([`Config::most_workers`]: its own and a few of a run's, a
    /// pool of tool calls or a small executor) and a whole `limits.max_processes` on top,
    /// so that one worker can always reach its own bound while all the others are alive.
    /// With the defaults: 108 × 8 + 256 = 1120, a small part of a host's pids.
    pub fn max_total_processes(&self) -> u64 {
        self.limits.max_total_processes.unwrap_or_else(|| {
            (self.most_workers() * 8 + self.limits.max_processes).min(MAX_TOTAL_PROCESSES)
        })
    }

    /// What `limits.max_total_memory_mb` asks of the instance's cgroup.
    pub fn memory_bound(&self) -> crate::pool::cgroup::MemoryBound {
        use crate::pool::cgroup::MemoryBound;
        match self.limits.max_total_memory_mb {
            None => MemoryBound::HalfOfHost,
            Some(0) => MemoryBound::Off,
            Some(mb) => MemoryBound::Bytes(mb.saturating_mul(1 << 20)),
        }
    }

    fn total_memory_problem(&self) -> Option<String> {
        let total = self.limits.max_total_memory_mb.filter(|&mb| mb > 0)?;
        let one = self.limits.memory_limit_mb;
        if total < one {
            return Some(format!(
                "limits.max_total_memory_mb is {total} but must be at least limits.memory_limit_mb ({one}), so that one job can always reach its own bound; raise it, set 0 for no bound, or leave it unset (half the host's memory)"
            ));
        }
        if total > MAX_TOTAL_MEMORY_MB {
            return Some(format!(
                "limits.max_total_memory_mb is {total} but must be at most {MAX_TOTAL_MEMORY_MB} (8 PiB); set 0 for no bound"
            ));
        }
        if self
            .sandbox
            .layers_off
            .contains(&snakecage_worker::protocol::Layer::Cgroup)
        {
            return Some(format!(
                "limits.max_total_memory_mb is {total} but the cgroup sandbox layer, which bounds it, is switched off (sandbox.layers_off); remove one of the two"
            ));
        }
        None
    }

    fn total_processes_problem(&self) -> Option<String> {
        let total = self.max_total_processes();
        let need = self.most_workers() + self.limits.max_processes;
        if total < need {
            return Some(format!(
                "limits.max_total_processes is {total} but must be at least {need}: up to {} workers can be alive at once, each a process of the instance's cgroup, and one of them may start limits.max_processes ({}) threads; raise it or leave it unset",
                self.most_workers(),
                self.limits.max_processes
            ));
        }
        if total > MAX_TOTAL_PROCESSES {
            return Some(format!(
                "limits.max_total_processes is {total} but the kernel counts at most {MAX_TOTAL_PROCESSES} pids: lower it or leave it unset"
            ));
        }
        None
    }

    /// `sandbox.uid_count`, or the default: [`Config::most_workers`] and the probe's, in
    /// blocks of 64 (at most what a u32 holds: an unusable count is refused by
    /// [`Config::validate`]).
    pub fn uid_count(&self) -> u32 {
        match self.sandbox.uid_count {
            Some(count) => count,
            None => u32::try_from((self.most_workers() + 1).div_ceil(64) * 64).unwrap_or(u32::MAX),
        }
    }

    fn uid_range_problem(&self) -> Option<String> {
        let need = self.most_workers() + 1;
        let count = u64::from(self.uid_count());
        if count < need {
            return Some(format!(
                "sandbox.uid_count is {count} but up to {} workers can be alive at once (sessions.max_sessions {}, pool.size {} and {} tiers with tiers.min_idle {}), each with a uid of its own, and one is the start-up probe's: set sandbox.uid_count to at least {need}, or leave it unset",
                need - 1,
                self.sessions.max_sessions,
                self.pool.size,
                self.tiers.profile.len(),
                self.tiers.min_idle
            ));
        }
        let first = u64::from(self.sandbox.uid.unwrap_or(crate::pool::uids::AUTO_FIRST));
        let last = first + count - 1;
        if last >= u64::from(u32::MAX) {
            return Some(format!(
                "sandbox.uid {first} + sandbox.uid_count {count} runs past the largest uid ({}): lower sandbox.uid",
                u32::MAX - 1
            ));
        }
        if self.sandbox.uid.is_none() && last > u64::from(crate::pool::uids::AUTO_LAST) {
            return Some(format!(
                "{count} worker uids do not fit in {}–{}, where an unset sandbox.uid takes them: set sandbox.uid to the first id of a free range",
                crate::pool::uids::AUTO_FIRST,
                crate::pool::uids::AUTO_LAST
            ));
        }
        None
    }

    /// Where stored files live.
    pub fn files_dir(&self) -> PathBuf {
        self.files
            .dir
            .clone()
            .unwrap_or_else(|| self.worker.state_dir.join("files"))
    }

    /// Where environment generations live (`packages.envs_dir`).
    pub fn envs_dir(&self) -> PathBuf {
        self.packages.envs_dir(&self.worker.state_dir)
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

#[cfg(test)]
mod tests {
    use super::*;
    use snakecage_worker::protocol::Layer;

    #[test]
    fn pool_size_is_described_as_the_jobs_that_run_at_once_as_well() {
        use clap::Args;
        let command = Overrides::augment_args(clap::Command::new("snakecage"));
        let help = command
            .get_arguments()
            .find(|a| a.get_long() == Some("pool-size"))
            .and_then(|a| a.get_help())
            .unwrap()
            .to_string();
        assert!(
            help.starts_with("Jobs that run at once, and idle pre-forked workers kept ready"),
            "{help}"
        );
    }

    #[test]
    fn a_pool_size_of_none_or_past_the_most_a_host_runs_is_refused_naming_the_key() {
        let with = |size: usize| {
            let mut c = Config::default();
            c.pool.size = size;
            c.validate().err().map(|e| e.to_string())
        };
        assert_eq!(
            with(0).as_deref(),
            Some("configuration: pool.size must be at least 1")
        );
        assert_eq!(with(MAX_POOL_SIZE), None);
        assert_eq!(
            with(MAX_POOL_SIZE + 1).as_deref(),
            Some(
                "configuration: pool.size is 1025 but may be at most 1024: it is the jobs that \
                 run at once (each on a worker, with as many idle ones kept ready), and the \
                 default is 2 × the host's cores; more jobs can wait in pool.queue_length"
            )
        );
    }

    #[test]
    fn a_client_timeout_outside_a_second_to_an_hour_is_refused() {
        let with = |ms: u64| {
            let mut c = Config::default();
            c.limits.client_timeout_ms = ms;
            c.validate().err().map(|e| e.to_string())
        };
        assert_eq!(with(1_000), None);
        assert_eq!(with(3_600_000), None);
        for bad in [0, 999, 3_600_001] {
            assert_eq!(
                with(bad),
                Some(format!(
                    "configuration: limits.client_timeout_ms is {bad} but must be from 1000 (a \
                     second) to 3600000 (an hour): how long a client may take to send a \
                     request's headers, and may let its request body stall"
                ))
            );
        }
    }

    #[test]
    fn a_directory_key_that_names_a_file_or_holds_a_nul_is_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fichier");
        std::fs::write(&file, "").unwrap();
        let with = |edit: &dyn Fn(&mut Config)| {
            let mut c = Config::default();
            c.worker.state_dir = dir.path().join("état");
            edit(&mut c);
            c.validate().err().map(|e| e.to_string())
        };
        assert_eq!(with(&|_| {}), None, "a directory yet to be made");
        let shown = file.display();
        assert_eq!(
            with(&|c| c.worker.state_dir = file.clone()),
            Some(format!(
                "configuration: worker.state_dir \"{shown}\" is not a directory: give a directory"
            ))
        );
        assert_eq!(
            with(&|c| c.files.dir = Some(file.join("x"))),
            Some(format!(
                "configuration: files.dir \"{shown}/x\" has a file, not a directory, on its way: give a directory"
            ))
        );
        assert_eq!(
            with(&|c| c.workspace.dir = Some("/tmp/a\0b".into())),
            Some(
                "configuration: workspace.dir \"/tmp/a\\0b\" holds a NUL byte, which no path can: give a directory"
                    .to_owned()
            )
        );
        let missing = dir.path().join("ü").join("nope");
        assert_eq!(
            with(&|c| c.python.home = Some(missing.clone())),
            Some(format!(
                "configuration: python.home \"{}\" does not exist: give a directory",
                missing.display()
            ))
        );
    }

    #[test]
    fn a_log_level_that_would_silence_the_log_is_refused() {
        let with = |level: &str| {
            let mut c = Config::default();
            c.log.level = level.into();
            c.validate()
        };
        for good in [
            "info",
            "WARN",
            "warn,snakecage=debug",
            "snakecage::pool=trace",
            "off",
        ] {
            with(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in ["warning", "verbose", "", "info,", "info,débogage"] {
            let e = with(bad).unwrap_err().to_string();
            assert!(
                e.contains("log.level") && e.contains("is not a log filter"),
                "{bad}: {e}"
            );
        }
        let e = with("snakecage=loud").unwrap_err().to_string();
        assert!(e.contains("log.level"), "{e}");
    }

    #[test]
    fn a_key_share_outside_1_to_100_percent_and_no_files_per_run_are_refused() {
        let with = |edit: &dyn Fn(&mut Config)| {
            let mut c = Config::default();
            edit(&mut c);
            c.validate().err().map(|e| e.to_string())
        };
        for bad in [0, 101] {
            let e = with(&|c| c.files.key_share_percent = bad).unwrap();
            assert!(
                e.contains(&format!(
                    "files.key_share_percent is {bad} but must be from 1 to 100"
                )),
                "{e}"
            );
        }
        assert_eq!(with(&|c| c.files.key_share_percent = 100), None);
        let e = with(&|c| c.workspace.max_files = 0).unwrap();
        assert!(e.contains("workspace.max_files must be at least 1"), "{e}");
    }

    #[test]
    fn the_total_process_bound_holds_every_worker_and_one_whole_worker() {
        let mut c = Config::default();
        c.pool.size = 4;
        assert_eq!(c.max_total_processes(), 108 * 8 + 256);
        c.validate().unwrap();
        c.limits.max_total_processes = Some(108 + 255);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("limits.max_total_processes is 363 but must be at least 364"),
            "{e}"
        );
        c.limits.max_total_processes = Some(364);
        c.validate().unwrap();
        c.limits.max_total_processes = Some(MAX_TOTAL_PROCESSES + 1);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("the kernel counts at most 4194304 pids"), "{e}");
        // The default follows the configuration, within what the kernel counts.
        c.limits.max_total_processes = None;
        c.sessions.max_sessions = 1_000_000;
        assert_eq!(c.max_total_processes(), MAX_TOTAL_PROCESSES);
    }

    #[test]
    fn the_total_memory_bound_holds_one_whole_job() {
        use crate::pool::cgroup::MemoryBound;
        let mut c = Config::default();
        assert_eq!(c.memory_bound(), MemoryBound::HalfOfHost);
        c.limits.max_total_memory_mb = Some(0);
        c.validate().unwrap();
        assert_eq!(c.memory_bound(), MemoryBound::Off);
        c.limits.max_total_memory_mb = Some(255);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains(
                "limits.max_total_memory_mb is 255 but must be at least limits.memory_limit_mb (256)"
            ),
            "{e}"
        );
        c.limits.max_total_memory_mb = Some(256);
        c.validate().unwrap();
        assert_eq!(c.memory_bound(), MemoryBound::Bytes(256 << 20));
        c.limits.max_total_memory_mb = Some(MAX_TOTAL_MEMORY_MB + 1);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("must be at most 8589934592"), "{e}");
        c.limits.max_total_memory_mb = Some(4096);
        c.sandbox.layers_off = vec![Layer::Cgroup];
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("the cgroup sandbox layer, which bounds it, is switched off"),
            "{e}"
        );
        // Unset or 0 with the layer off is no bound, as asked.
        c.limits.max_total_memory_mb = None;
        c.validate().unwrap();
    }

    #[test]
    fn the_worker_uid_range_fits_the_most_workers_alive_at_once() {
        let mut c = Config::default();
        c.pool.size = 4;
        // 64 sessions, 2 × 4 running or being reaped, 2 × (4 + 4 tiers × (1 + 2)) idle,
        // 4 rollover probes.
        assert_eq!(c.most_workers(), 108);
        assert_eq!(c.uid_count(), 128, "and the probe's, in blocks of 64");
        c.validate().unwrap();
        c.sandbox.uid_count = Some(108);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("set sandbox.uid_count to at least 109"), "{e}");
        c.sandbox.uid_count = Some(109);
        c.validate().unwrap();
        c.sandbox.uid = Some(u32::MAX - 100);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("runs past the largest uid (4294967294)"), "{e}");
        c.sandbox.uid = Some(0);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("must not be 0 (root)"), "{e}");
        // The uid of the days when every worker ran as nobody: what changed, what to write.
        c.sandbox.uid = Some(65_534);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("sandbox.uid = 65534: sandbox.uid no longer names the one uid every worker runs as (nobody); it is now the first id of a range"),
            "{e}"
        );
        assert!(e.contains("remove sandbox.uid"), "{e}");
        // Unset, the range is a block of 40000-59999: a count beyond it needs sandbox.uid.
        c.sandbox.uid = None;
        c.sandbox.uid_count = None;
        c.sessions.max_sessions = 30_000;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("do not fit in 40000–59999") && e.contains("set sandbox.uid"),
            "{e}"
        );
        c.sandbox.uid = Some(100_000);
        c.validate().unwrap();
        c.limits.max_processes = 23;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("limits.max_processes is 23 but must be at least 24"),
            "{e}"
        );
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
        assert_eq!((c.sandbox.uid, c.sandbox.gid), (Some(1234), 65534));
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
        std::fs::write(&file, "[limits]\nmax_timeout_ms = 600000\n").unwrap();
        let c = Config::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.limits.max_timeout_ms, 600_000);
        std::fs::write(&file, "[limits]\nmax_timeout_ms = 600001\n").unwrap();
        match Config::load(Some(&file), &Overrides::default()) {
            Err(ConfigError::Invalid(msg)) => {
                assert!(msg.contains("at most 600000"), "{msg}");
            }
            other => panic!("600001 ms accepted: {other:?}"),
        }
        for (life, ok) in [
            (1, false),
            (600, false),
            (601, true),
            (86_400, true),
            (86_401, false),
        ] {
            let toml =
                format!("[limits]\nmax_timeout_ms = 600000\nmax_session_cpu_seconds = {life}\n");
            std::fs::write(&file, toml).unwrap();
            match Config::load(Some(&file), &Overrides::default()) {
                Ok(c) => assert!(ok && c.limits.max_session_cpu_seconds == life, "{life}"),
                Err(ConfigError::Invalid(msg)) => assert!(
                    !ok && msg.contains(&format!(
                        "limits.max_session_cpu_seconds is {life} but must be from 601"
                    )),
                    "{life}: {msg}"
                ),
                Err(e) => panic!("{life}: {e}"),
            }
        }
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
