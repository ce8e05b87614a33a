//! `serve`: starts the pool, serves the API on a bound listener until `shutdown` fires (one
//! during start-up ends the start-up and closes the listener), then
//! answers `/ready` with 503 for `worker.shutdown_drain_ms` (load balancers stop sending),
//! drains in-flight requests (bounded) and tears the pool down. `main` and the tests both
//! call it. Every request gets an id (`x-request-id`, kept when the client sent one) and a
//! tracing span carrying it, so each log line of a request names it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::serve::ListenerExt;
use snakecage_worker::protocol::{LayerReport, LayerState, WorkerLimits, ZygoteConfig, ZygoteInfo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::LatencyUnit;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::api::{self, AppState};
use crate::auth::{KeyRing, Keys, KeysError};
use crate::cluster::{Cluster, ClusterError};
use crate::config::FilesBackend;
use crate::config::{Config, ConfigError};
use crate::files::local::LocalStoreSettings;
use crate::files::observed::Observed;
use crate::files::s3::S3StoreSettings;
use crate::files::{self, LocalStore, S3Store, SharedStore, StoreError};
use crate::generation::{GenerationInfo, Rollovers};
use crate::live::{Live, LiveCell};
use crate::metrics::{BuildInfo, Metrics};
use crate::packages::Packages;
use crate::pool::{Pool, PoolError, PoolSettings, TierSettings};
use crate::sessions::{SessionSettings, Sessions};
use crate::shutdown::{stopped_while_starting, until_requested};
use crate::tools::ToolContext;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("starting the worker pool: {0}")]
    Pool(#[from] PoolError),
    #[error("opening the file store: {0}")]
    Store(#[from] StoreError),
    #[error("serving HTTP: {0}")]
    Io(#[from] std::io::Error),
    #[error("API keys: {0}")]
    Keys(#[from] KeysError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(
        "refusing to listen on {0} without API keys: anyone who can reach it could run code and read every file. Configure keys (`snakecage keys add NAME --keys-file keys.toml`, then auth.keys_file), listen on 127.0.0.1, or pass --allow-unauthenticated (SNAKECAGE_ALLOW_UNAUTHENTICATED=1) if something in front of it authenticates"
    )]
    Unauthenticated(SocketAddr),
    #[error("tools: {0}")]
    Tools(String),
    #[error("package management: {0}")]
    Packages(#[from] crate::envs::EnvError),
}

/// The configured keys, and whether the service may listen where it does with them: beyond
/// loopback only with keys, or when explicitly allowed (then with a loud warning).
pub fn load_keys(config: &Config, listening: SocketAddr) -> Result<Keys, ServeError> {
    let keys = Keys::load(&config.auth)?.listening_on(listening);
    if keys.enabled() {
        tracing::info!(keys = keys.names().count(), "API keys required");
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

/// The niceness the lighter zygotes prepare at: the fullest one, which the service's
/// readiness waits for, gets the CPU first (BENCHMARKS.md, "Start-up").
const STARTUP_NICE_LIGHTER: i32 = 10;

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
            // The wall-clock kill comes first; CPU time is a backstop a little behind it.
            cpu_seconds: limits.max_timeout_ms.div_ceil(1000) + 1,
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
                // The lightest zygote is up first: the package scan is off the path of
                // the fuller ones, which decide when the service is ready.
                describe_packages: i == 0,
                startup_nice: if profile.preload.len() == fullest {
                    0
                } else {
                    STARTUP_NICE_LIGHTER
                },
                snapshot: profile.snapshot,
                immortal: profile.immortal,
                ..zygote.clone()
            },
        })
        .collect();
    Ok(PoolSettings {
        size: config.pool.size,
        queue_length: config.pool.queue_length,
        queue_timeout: Duration::from_millis(config.pool.queue_timeout_ms),
        spawn_timeout: Duration::from_millis(config.pool.spawn_timeout_ms),
        worker_binary: config.worker_binary(),
        workspace_root: config.workspace_root(),
        tiers,
        session_tier: config.tiers.session_tier(),
        min_idle: config.tiers.min_idle,
        require: config.sandbox.require.clone(),
    })
}

pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with(listener, config, shutdown, None).await
}

/// [`serve`], reloading on each `hangups` (SIGHUP, see [`crate::hangup`]) once serving.
pub async fn serve_with(
    listener: TcpListener,
    mut config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    hangups: Option<crate::hangup::ReloadSignal>,
) -> Result<(), ServeError> {
    let local_addr = listener.local_addr()?;
    let keys = Arc::new(KeyRing::new(load_keys(&config, listener.local_addr()?)?));
    // A CA file that cannot be read is the operator's to fix: said before any zygote starts.
    let trust_roots = crate::codemode::tls::TrustRoots::load(config.tools.ca_file.as_deref())
        .map_err(ServeError::Tools)?;
    // A managed environment (packages the operator added) replaces python.venv.
    let envs = crate::envs::EnvManager::open(&mut config)?;
    let settings = pool_settings(&config)?;
    let metrics = Arc::new(Metrics::new());
    let store = open_store(&config, metrics.clone())?;
    prepare_mpl_config_dir(&settings.tiers[0].zygote.mpl_config_dir)?;
    metrics.set_tenants(keys.load().names());
    // Answer at once while the zygotes start (503, Retry-After, what is happening); the
    // real router takes over when the pool is ready.
    let router_cell = api::starting::RouterCell::default();
    let tiers: Vec<&str> = settings.tiers.iter().map(|t| t.name.as_str()).collect();
    let what = format!(
        "its zygotes ({}) are preloading their modules and forking the first workers",
        tiers.join(", ")
    );
    // Watched from here on, not only once the service is ready: a shutdown asked for while
    // the zygotes start (which can take minutes) ends the start-up.
    let requested = CancellationToken::new();
    tokio::spawn({
        let requested = requested.clone();
        async move {
            shutdown.await;
            requested.cancel();
        }
    });
    let stop = CancellationToken::new();
    let server = tokio::spawn(listen(
        listener,
        api::starting::until_ready(router_cell.clone(), what, settings.size),
        stop.clone(),
    ));
    let pool_started = std::time::Instant::now();
    // The environment's stamp (tens of milliseconds of directory reads) and the cluster's
    // HTTP client (the platform's CA certificates read and parsed: 3 ms warm, 45 ms from
    // a cold page cache) are made while the zygotes start, not before or after: they are
    // off the path to ready.
    let starting = async {
        tokio::join!(
            crate::generation::stamp::EnvStamp::read_off_thread(&config),
            Pool::start_observed(settings, metrics.clone()),
            Cluster::new_off_thread(&config.cluster),
        )
    };
    // Given up, the start-up's zygotes are killed with it (`kill_on_drop`, and their
    // `PR_SET_PDEATHSIG` once this process exits) and its workspace root is removed (the
    // root's guard is dropped with the start-up). A start-up that fails past this point
    // shuts the pool down, which does the same.
    let Some((environment, started, cluster)) = until_requested(starting, &requested).await else {
        return stopped_while_starting(stop, server).await;
    };
    let pool = match started {
        Ok(pool) => pool,
        Err(e) => {
            stop.cancel();
            let _ = server.await;
            return Err(e.into());
        }
    };
    let cluster = match cluster {
        Ok(cluster) => Arc::new(cluster),
        Err(e) => {
            pool.shutdown().await;
            stop.cancel();
            let _ = server.await;
            return Err(e.into());
        }
    };
    let first_generation = GenerationInfo::first(
        pool.generation(),
        u64::try_from(pool_started.elapsed().as_millis()).unwrap_or(u64::MAX),
    );
    metrics.set_generation(first_generation.id);
    metrics.set_tiers(&pool.tier_names());
    let info = pool.zygote_info();
    // The zygote's hello says which Python and which sandbox layers are running.
    metrics.set_build_info(build_info(&info));
    tracing::info!(
        addr = %local_addr,
        python = %info.python_version,
        preloaded = ?info.preloaded.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        "snakecage is listening"
    );
    for failure in &info.preload_failures {
        tracing::warn!(%failure, "a configured preload module is not available");
    }
    log_sandbox(&info.sandbox);
    let grace = Duration::from_millis(config.worker.shutdown_grace_ms);
    if config.files.ttl_seconds > 0 {
        let ttl = Duration::from_secs(config.files.ttl_seconds);
        files::spawn_sweeper(store.clone(), files::sweep_interval(ttl), stop.clone());
    }
    let mut session_settings = session_settings(&config);
    session_settings.id_prefix = cluster.id_prefix();
    let sessions = Sessions::new(
        pool.clone(),
        session_settings,
        metrics.clone(),
        stop.clone(),
    );
    let catalog = crate::codemode::Catalog::start(&config.tools, trust_roots);
    let Some(catalog) = until_requested(catalog, &requested).await else {
        pool.shutdown().await;
        return stopped_while_starting(stop, server).await;
    };
    let catalog = match catalog {
        Ok(catalog) => catalog,
        Err(e) => {
            pool.shutdown().await;
            stop.cancel();
            let _ = server.await;
            return Err(ServeError::Tools(e.to_string()));
        }
    };
    metrics.set_tool_names(catalog.names());
    let packages = Packages::new(&info);
    // The MCP server's descriptions are the same for every caller: they name the host
    // tools every caller has (the rest are found with tools.search()).
    let tool_context = ToolContext::new(&config, info.python_version.clone(), packages.installed())
        .with_code_tools(catalog.public());
    let drain = Duration::from_millis(config.worker.shutdown_drain_ms);
    let stopping = CancellationToken::new();
    let live = LiveCell::new(Live {
        config: Arc::new(config),
        packages: Arc::new(packages),
        tool_context: Arc::new(tool_context),
        generation: first_generation,
        environment,
    });
    let state = Arc::new(AppState {
        live: Arc::new(live),
        rollovers: Rollovers::default(),
        pool: pool.clone(),
        store_watch: files::watch::StoreWatch::spawn(
            store.clone(),
            files::watch::CHECK_INTERVAL,
            stop.clone(),
        ),
        store,
        sessions,
        catalog: Arc::new(catalog),
        runs: crate::runs::Runs::with_id_prefix(cluster.id_prefix()),
        metrics,
        keys,
        cluster,
        envs,
        stopping: stopping.clone(),
    });
    if let Some(hangups) = hangups {
        crate::hangup::spawn(hangups, state.clone(), stopping.clone());
    }
    // Outermost first: the id is set, then echoed in the response, then the span made.
    let app = api::router(state)
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(
                    DefaultOnResponse::new()
                        .level(Level::INFO)
                        .latency_unit(LatencyUnit::Micros),
                )
                .on_failure(DefaultOnFailure::new().level(Level::WARN)),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(axum::middleware::map_request(drop_unfit_request_id));

    let stop_signal = stop.clone();
    tokio::spawn(async move {
        requested.cancelled().await;
        stopping.cancel();
        if !drain.is_zero() {
            tracing::info!(
                ?drain,
                "not ready any more; draining before closing the listener"
            );
            tokio::time::sleep(drain).await;
        }
        stop_signal.cancel();
    });
    let _ = router_cell.set(app);
    tokio::select! {
        result = server => result.map_err(std::io::Error::other)??,
        () = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "in-flight requests did not finish within the grace period; killing their workers");
        }
    }
    pool.shutdown().await;
    tracing::info!("snakecage stopped");
    Ok(())
}

/// Serves `app` on `listener` until `stop` fires, then lets in-flight requests finish.
async fn listen(
    listener: TcpListener,
    app: axum::Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    // No Nagle: a streamed event (or any response written in more than one piece) must
    // leave at once, not wait for the client's delayed ACK of the previous write.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a connection");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
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
fn prepare_mpl_config_dir(dir: &std::path::Path) -> std::io::Result<()> {
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

/// The longest client-sent `x-request-id` kept.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Keeps a client's `x-request-id` only when it is a plain token (letters, digits, `-`,
/// `_`, `.`, `:`, at most 128): anything else is dropped and the request gets an id of
/// ours. Before any authentication, an id is written into every log line of the request,
/// where one with spaces and `=` could pass for fields of its own (`path=/v1/admin/…`).
async fn drop_unfit_request_id(mut request: Request<Body>) -> Request<Body> {
    let fit = |v: &axum::http::HeaderValue| {
        let b = v.as_bytes();
        !b.is_empty()
            && b.len() <= MAX_REQUEST_ID_LEN
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
    };
    let headers = request.headers_mut();
    if headers.get_all("x-request-id").iter().count() > 1
        || headers.get("x-request-id").is_some_and(|v| !fit(v))
    {
        headers.remove("x-request-id");
    }
    request
}

/// The span every log line of a request is written in: its id, method and path (never its
/// body: code and output are not logged).
fn request_span(request: &Request<Body>) -> tracing::Span {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
    )
}

/// What `snakecage_build_info` and the status page say is running.
pub fn build_info(zygote: &ZygoteInfo) -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        python_version: zygote.python_version.clone(),
        sandbox_layers: sandbox_layers(zygote),
    }
}

/// The sandbox layers the zygote's start-up probe found active, by name.
fn sandbox_layers(zygote: &ZygoteInfo) -> Vec<String> {
    zygote
        .sandbox
        .iter()
        .filter(|r| r.state == LayerState::Active)
        .map(|r| r.layer.as_str().to_owned())
        .collect()
}

/// The file store the configuration describes (local disk or S3), its operations
/// recorded in `metrics`.
pub fn open_store(config: &Config, metrics: Arc<Metrics>) -> Result<SharedStore, StoreError> {
    let files = &config.files;
    let max_file_bytes = files.max_file_size_mb << 20;
    let quota_bytes = (files.quota_mb > 0).then_some(files.quota_mb << 20);
    let ttl = (files.ttl_seconds > 0).then(|| Duration::from_secs(files.ttl_seconds));
    Ok(match files.backend {
        FilesBackend::Local => {
            let store = LocalStore::open(LocalStoreSettings {
                dir: config.files_dir(),
                max_file_bytes,
                quota_bytes,
                ttl,
            })?;
            Arc::new(Observed::new(store, metrics))
        }
        FilesBackend::S3 => {
            let settings = S3StoreSettings {
                max_file_bytes,
                quota_bytes,
                ttl,
            };
            Arc::new(Observed::new(S3Store::open(&config.s3, settings)?, metrics))
        }
    })
}

/// One log line per sandbox layer: active ones at info, the others as warnings (a layer
/// switched off is for benchmarks only).
fn log_sandbox(layers: &[LayerReport]) {
    for r in layers {
        let layer = r.layer.as_str();
        match r.state {
            LayerState::Active => tracing::info!(layer, detail = %r.detail, "sandbox layer active"),
            LayerState::Off => tracing::warn!(
                layer,
                detail = %r.detail,
                "SANDBOX LAYER SWITCHED OFF by configuration: workers run with less isolation"
            ),
            LayerState::Unavailable => tracing::warn!(
                layer,
                detail = %r.detail,
                "sandbox layer unavailable on this host; add it to sandbox.require to refuse to start"
            ),
        }
    }
}
