//! The sections of the configuration file, one struct each, with their defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use snakecage_worker::protocol::{Layer, SandboxConfig};

/// The largest `limits.max_timeout_ms` an operator may configure: 10 minutes.
pub const MAX_TIMEOUT_CEILING_MS: u64 = 600_000;

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
    /// Jobs that run at once, and idle pre-forked workers kept ready. Default: 2 × cores.
    pub size: usize,
    /// Requests that may wait for a worker; one more gets 429.
    pub queue_length: usize,
    /// A request that waited this long for a worker gets 503.
    pub queue_timeout_ms: u64,
    /// How long a new worker may take to become ready (longer when the host starves it
    /// of CPU: `pool::starved`).
    pub spawn_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// `timeout_ms` when the request does not give one.
    pub default_timeout_ms: u64,
    /// Largest `timeout_ms` a request may ask for.
    /// At most [`MAX_TIMEOUT_CEILING_MS`].
    pub max_timeout_ms: u64,
    /// Memory a job may allocate on top of the preloaded interpreter.
    pub memory_limit_mb: u64,
    /// Per stream (stdout, stderr); a longer stream keeps its first and last halves of
    /// this, its middle cut and marked with the count of the bytes left out.
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
    /// RLIMIT_NPROC for workers: processes and threads of the worker's uid. Each worker has
    /// a uid of its own (`sandbox.uid`), so this bounds one worker: its threads, a thread
    /// bomb's included, never take another's. At least `tools.max_concurrent_calls` + 16
    /// (a thread per tool call in flight, and the worker's own). Where the service does not
    /// run as root, workers keep its uid and the kernel counts every process of that uid.
    pub max_processes: u64,
    /// `pids.max` of the instance's cgroup (the `cgroup` sandbox layer): the processes and
    /// threads of all workers together. Unset: [`super::Config::max_total_processes`].
    /// At least the most workers alive at once plus `max_processes` (every worker's own
    /// thread, and one worker all its threads); at most 4194304 (the kernel's largest pid).
    pub max_total_processes: Option<u64>,
    /// The memory of all workers together (the `cgroup` sandbox layer: a memory cgroup of
    /// the instance's own), in MiB; past it the kernel's out-of-memory killer ends the
    /// largest worker. Unset: half the host's memory (or of the service's own cgroup's
    /// limit, if lower), where a memory cgroup can be made; `0`: no bound. Set, it is at
    /// least `memory_limit_mb` (one job can always reach its own bound), and the service
    /// does not start where it cannot be applied.
    pub max_total_memory_mb: Option<u64>,
    /// Where the service cannot renew the kernel's CPU-time limit of a session's worker
    /// for each run (it lacks CAP_SYS_RESOURCE) and enforces each run's budget itself:
    /// the CPU time a session's worker may use in its whole life, all its runs together,
    /// the kernel's last backstop behind the service's. From one run's budget
    /// ([`LimitsConfig::cpu_seconds`]) to [`MAX_SESSION_CPU_SECONDS`].
    pub max_session_cpu_seconds: u64,
    /// How long a client may take to send a request's headers (from the connection's
    /// start, or from its previous answer on a kept-alive one), and how long a request
    /// body it sends may stall between two pieces; past it the connection is closed. From
    /// [`MIN_CLIENT_TIMEOUT_MS`] to [`MAX_CLIENT_TIMEOUT_MS`].
    pub client_timeout_ms: u64,
}

/// The least `limits.client_timeout_ms`: a second.
pub const MIN_CLIENT_TIMEOUT_MS: u64 = 1_000;
/// The largest `limits.client_timeout_ms`: an hour.
pub const MAX_CLIENT_TIMEOUT_MS: u64 = 3_600_000;

/// The largest `limits.max_session_cpu_seconds`: a day of CPU time.
pub const MAX_SESSION_CPU_SECONDS: u64 = 86_400;

impl LimitsConfig {
    /// One run's CPU-time budget (`RLIMIT_CPU`): `max_timeout_ms` and a second, a
    /// backstop a little behind the wall-clock kill, which comes first.
    pub fn cpu_seconds(&self) -> u64 {
        self.max_timeout_ms.div_ceil(1000) + 1
    }
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
    /// `local` (a directory, `dir`) or `s3` (the object store of `[s3]`, shared by replicas).
    pub backend: super::FilesBackend,
    /// Where stored files and their metadata live; default: `files` under
    /// `worker.state_dir`. Unlike the workspaces it is kept at shutdown, so files survive a
    /// restart.
    pub dir: Option<PathBuf>,
    /// Largest upload (and largest file a run may leave behind to be stored).
    pub max_file_size_mb: u64,
    /// Stored files are deleted this long after they were stored; 0 keeps them.
    pub ttl_seconds: u64,
    /// What all stored files may be charged together (each file its size rounded up to
    /// whole blocks of the store, plus one block for its metadata); a store that would grow
    /// past it answers 507. 0 means no quota.
    pub quota_mb: u64,
    /// Files the store may hold in all (each costs inodes, whatever its size); 0: no bound.
    pub max_files: u64,
    /// Files one API key may hold; 0: no bound.
    pub max_files_per_key: u64,
    /// The percentage of `quota_mb` an API key without its own `max_stored_mb` may hold
    /// (1 to 100; 100: as much as the store).
    pub key_share_percent: u64,
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
    /// The most files one run's collection stores; the rest are reported as skipped.
    pub max_files: usize,
    /// Mount a tmpfs of the service's own over its workspace root at start, bounding all
    /// its workspaces together (needs CAP_SYS_ADMIN; without it the workspaces share the
    /// base directory's file system and `/health` says why).
    pub mount: bool,
    /// That tmpfs's size; 0: a quarter of RAM, at most the size of the file system `dir`
    /// is on. More than the RAM or than that file system is refused at start.
    pub size_mb: u64,
    /// That tmpfs's inodes (files and directories of all workspaces); 0: one per 32 KiB
    /// of its size.
    pub max_inodes: u64,
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
    /// A session created with `"replay": true` keeps at most this many successful runs to
    /// replay on a new worker when its worker is lost; past it, it can no longer be rebuilt.
    pub replay_max_runs: usize,
    /// The same bound on the bytes those runs hold: code (and stdin, args), and their tool
    /// calls' arguments and answers.
    pub replay_max_bytes: usize,
    /// The most a session's workspace may take (bytes allocated, sparse files as what they
    /// cost; at most a quarter of the workspace file system), checked after each of its
    /// runs: past it (or past `workspace.max_entries`
    /// entries) the session is ended, which frees the space; what its runs wrote is in the
    /// file store already. Without it a session could hold the instance's workspace space
    /// for its whole life (`max_ttl_seconds`).
    pub max_workspace_mb: u64,
}

/// The isolation layers (SECURITY.md describes each one).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    /// Layers that must be active: start-up fails if one of them is not.
    pub require: Vec<Layer>,
    /// Layers switched off, for benchmarking only; every one is logged as a warning.
    pub layers_off: Vec<Layer>,
    /// Where the service runs as root, each worker drops to a uid of its own, from the
    /// range of `uid_count` ids starting here (the first is the start-up probe's), claimed
    /// for this instance with a lock in `/run/snakecage`. Unset: the first free block of
    /// ids 40000–59999 that the service's user namespace maps and that holds no id the
    /// system names; a range set here that holds one is refused (`pool::uid_accounts`).
    pub uid: Option<u32>,
    /// How many ids; unset: enough for the most workers that can live at once
    /// ([`super::Config::most_workers`]), and one for the probe, in blocks of 64.
    pub uid_count: Option<u32>,
    /// The gid every worker drops to, with no supplementary groups.
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
            uid: None,
            uid_count: None,
            gid: defaults.gid,
            allowed_packages: defaults.allowed_packages,
        }
    }
}

impl SandboxSettings {
    /// What the zygote is told.
    pub fn zygote_config(&self) -> SandboxConfig {
        SandboxConfig {
            // The probe's uid: the range's first, once claimed (`pool::uids`).
            uid: self.uid.unwrap_or(crate::pool::uids::AUTO_FIRST),
            gid: self.gid,
            layers_off: self.layers_off.clone(),
            allowed_packages: self.allowed_packages.clone(),
            // Set by the pool once it has made (or failed to make) the instance's cgroup.
            cgroup: Default::default(),
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

impl LogConfig {
    /// `log.level` as a `tracing` filter: levels, `target=level` pairs, comma-separated.
    /// `tracing` reads a bare word that is no level (`warning`, `verbose`) as a target to
    /// log everything of, which silences every other line, errors included: refused.
    pub fn check_level(&self) -> Result<(), String> {
        const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
        let what_to_give = "give a level (error, warn, info, debug, trace, off) or \
                            target=level pairs, e.g. \"info,snakecage=debug\"";
        for directive in self.level.split(',').map(str::trim) {
            let bare_word = !directive.contains(['=', '[', ':']);
            if directive.is_empty()
                || bare_word && !LEVELS.contains(&&*directive.to_ascii_lowercase())
            {
                return Err(format!(
                    "log.level {:?} is not a log filter: {directive:?} is no level; {what_to_give}",
                    self.level
                ));
            }
        }
        tracing_subscriber::EnvFilter::try_new(&self.level)
            .map(drop)
            .map_err(|e| {
                format!(
                    "log.level {:?} is not a log filter ({e}); {what_to_give}",
                    self.level
                )
            })
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
            max_processes: 256,
            max_total_processes: None,
            max_total_memory_mb: None,
            max_session_cpu_seconds: 3_600,
            client_timeout_ms: 75_000,
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
            replay_max_runs: 200,
            replay_max_bytes: 1 << 20,
            max_workspace_mb: 1024,
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
            backend: super::FilesBackend::Local,
            dir: None,
            max_file_size_mb: 100,
            ttl_seconds: 3600,
            quota_mb: 10 << 10,
            max_files: 100_000,
            max_files_per_key: 10_000,
            key_share_percent: 25,
        }
    }
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        Self {
            dir: None,
            max_total_mb: 500,
            max_entries: 10_000,
            max_files: 1_000,
            mount: true,
            size_mb: 0,
            max_inodes: 0,
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
