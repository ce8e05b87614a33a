//! What a configuration implies for the parts `serve` starts: the API keys and where they
//! allow listening, the pool's tiers, the session rules, the file store, matplotlib's
//! shared config directory.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use snakecage_worker::protocol::{Layer, WorkerLimits, ZygoteConfig};

use super::ServeError;
use crate::auth::Keys;
use crate::config::FilesBackend;
use crate::config::{Config, ConfigError};
use crate::files::local::LocalStoreSettings;
use crate::files::observed::Observed;
use crate::files::s3::S3StoreSettings;
use crate::files::{Charge, LocalStore, S3Store, SharedStore, StoreBounds, StoreError};
use crate::metrics::Metrics;
use crate::pool::bound::{self, HostRoom};
use crate::pool::cpu_budget::Enforcement;
use crate::pool::{BoundSettings, CgroupSettings, PoolSettings, TierSettings, UidSettings};
use crate::sessions::SessionSettings;

/// The configured keys, and whether the service may listen where it does with them: beyond
/// loopback only with keys, or when explicitly allowed (then with a loud warning).
pub fn load_keys(config: &Config, listening: SocketAddr) -> Result<Keys, ServeError> {
    let keys = Keys::load(&config.auth)?.listening_on(listening);
    if keys.enabled() {
        tracing::info!(keys = keys.names().count(), "API keys required");
        for warning in keys.sessions_above_global(config.sessions.max_sessions) {
            tracing::warn!("{warning}");
        }
    } else if !listening.ip().is_loopback() {
        if !config.auth.allow_unauthenticated {
            return Err(ServeError::Unauthenticated(listening));
        }
        tracing::warn!(
            addr = %listening,
            "NO AUTHENTICATION: listening beyond loopback without API keys \
             (--allow-unauthenticated); anyone who can reach this port can run code and \
             read, replace and delete every stored file"
        );
    }
    Ok(keys)
}

/// The niceness the zygotes between the lightest and the fullest prepare at: the lightest
/// one, which the service's readiness waits for, and the fullest one, which takes longest,
/// get the CPU first (BENCHMARKS.md, "Start-up").
const STARTUP_NICE_BETWEEN: i32 = 10;

/// The pool settings a configuration implies: one zygote configuration per tier, the
/// same but for its name, preloads and warm-up.
pub fn pool_settings(config: &Config) -> Result<PoolSettings, ConfigError> {
    let layout = config.python.layout()?;
    let state_dir = &config.worker.state_dir;
    let limits = &config.limits;
    let zygote = ZygoteConfig {
        python_home: layout.home,
        site_packages: layout.site_packages,
        tier: String::new(),
        preload: Vec::new(),
        warm_up: Vec::new(),
        snapshot: false,
        immortal: true,
        // Shared by every tier: the plotting zygote builds the font cache there, which a
        // worker of another tier importing matplotlib then reads.
        describe_packages: true,
        startup_nice: 0,
        mpl_config_dir: state_dir.join("mplconfig"),
        limits: WorkerLimits {
            memory_limit_bytes: limits.memory_limit_mb << 20,
            cpu_seconds: limits.cpu_seconds(),
            cpu_life_seconds: (Enforcement::here() == Enforcement::Watchdog)
                .then_some(limits.max_session_cpu_seconds),
            max_file_bytes: limits.max_file_size_mb << 20,
            max_open_files: limits.max_open_files,
            max_processes: limits.max_processes,
        },
        sandbox: config.sandbox.zygote_config(),
        supervisor_pid: Some(std::process::id() as i32),
    };
    let fullest = config
        .tiers
        .profile
        .iter()
        .map(|profile| profile.preload.len())
        .max()
        .unwrap_or(0);
    let tiers = config
        .tiers
        .profile
        .iter()
        .enumerate()
        .map(|(i, profile)| TierSettings {
            name: profile.name.clone(),
            zygote: ZygoteConfig {
                tier: profile.name.clone(),
                preload: profile.preload.clone(),
                warm_up: profile.warm_up(),
                // One zygote scans the packages (the same for every tier): the lightest,
                // which the service's readiness waits for, so `/v1/packages` is complete
                // from the first answer; the scan costs it a few milliseconds.
                describe_packages: i == 0,
                startup_nice: if i == 0 || profile.preload.len() == fullest {
                    0
                } else {
                    STARTUP_NICE_BETWEEN
                },
                snapshot: profile.snapshot,
                immortal: profile.immortal,
                ..zygote.clone()
            },
        })
        .collect();
    let workspace_root = config.workspace_root();
    let bound = BoundSettings {
        mount: config.workspace.mount,
        size_bytes: (config.workspace.size_mb > 0)
            .then_some(config.workspace.size_mb.saturating_mul(1 << 20)),
        inodes: (config.workspace.max_inodes > 0).then_some(config.workspace.max_inodes),
    };
    let base = workspace_root.parent().unwrap_or(&workspace_root);
    bound::check_size(&bound, base, HostRoom::of(base)).map_err(ConfigError::Invalid)?;
    Ok(PoolSettings {
        size: config.pool.size,
        queue_length: config.pool.queue_length,
        queue_timeout: Duration::from_millis(config.pool.queue_timeout_ms),
        spawn_timeout: Duration::from_millis(config.pool.spawn_timeout_ms),
        worker_binary: config.worker_binary(),
        workspace_root,
        bound,
        tiers,
        session_tier: config.tiers.session_tier(),
        min_idle: config.tiers.min_idle,
        require: config.sandbox.require.clone(),
        uids: UidSettings {
            first: config.sandbox.uid,
            count: config.uid_count(),
            lock_file: crate::pool::uids::LOCK_FILE.into(),
        },
        cgroup: CgroupSettings {
            wanted: config.sandbox.zygote_config().wants(Layer::Cgroup),
            max_processes: config.max_total_processes(),
            memory: config.memory_bound(),
            lock_dir: crate::pool::cgroup::LOCK_DIR.into(),
        },
    })
}

/// matplotlib's config and cache directory, shared by every tier: the plotting zygote
/// writes its font cache there, and a worker of any other tier that imports matplotlib
/// (behind the import scan's back) reads it. matplotlib insists on a directory that
/// `access(W_OK)` calls writable, and otherwise makes a temporary one and exports it with
/// `os.putenv`, which the audit hook denies: the import would fail. So the directory is
/// `/tmp`-like for the file permissions (mode 1777: anyone may create, nobody may replace
/// or remove another's file, such as the root-owned font cache), while a worker can still
/// write nothing there: Landlock grants it read access only (`access` is not a Landlock
/// check) and the audit hook denies opening it for writing. A directory this process does
/// not own (another instance's) keeps its mode: only such an import is then affected.
pub(super) fn prepare_mpl_config_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    if let Err(e) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot open matplotlib's config dir to workers");
    }
    Ok(())
}

/// The session rules the configuration describes.
pub fn session_settings(config: &Config) -> SessionSettings {
    let s = &config.sessions;
    SessionSettings {
        idle_timeout: Duration::from_secs(s.idle_timeout_seconds),
        max_sessions: s.max_sessions,
        max_ttl: Duration::from_secs(s.max_ttl_seconds),
        interrupt_grace: Duration::from_millis(s.interrupt_grace_ms),
        replay: crate::sessions::replay::ReplayLimits {
            max_runs: s.replay_max_runs,
            max_bytes: s.replay_max_bytes,
        },
        id_prefix: String::new(),
    }
}

/// The file store the configuration describes (local disk or S3), its operations
/// recorded in `metrics`.
pub fn open_store(config: &Config, metrics: Arc<Metrics>) -> Result<SharedStore, StoreError> {
    let files = &config.files;
    let max_file_bytes = files.max_file_size_mb << 20;
    let quota_bytes = (files.quota_mb > 0).then_some(files.quota_mb << 20);
    let bounds = StoreBounds {
        quota_bytes,
        max_files: (files.max_files > 0).then_some(files.max_files),
        max_files_per_key: (files.max_files_per_key > 0).then_some(files.max_files_per_key),
        // Without keys there is one owner, and the store's quota is its.
        key_share_bytes: quota_bytes
            .filter(|_| files.key_share_percent < 100)
            .map(|quota| (u128::from(quota) * u128::from(files.key_share_percent) / 100) as u64),
    };
    let ttl = (files.ttl_seconds > 0).then(|| Duration::from_secs(files.ttl_seconds));
    Ok(match files.backend {
        FilesBackend::Local => {
            let dir = config.files_dir();
            // The file system is the one the directory is on once it exists.
            std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
                doing: "creating",
                path: dir.clone(),
                source,
            })?;
            let store = LocalStore::open(LocalStoreSettings {
                charge: Charge::for_dir(&dir),
                dir,
                max_file_bytes,
                bounds,
                ttl,
            })?;
            Arc::new(Observed::new(store, metrics))
        }
        FilesBackend::S3 => {
            let settings = S3StoreSettings {
                max_file_bytes,
                bounds,
                charge: Charge::default(),
                ttl,
            };
            Arc::new(Observed::new(S3Store::open(&config.s3, settings)?, metrics))
        }
    })
}
