//! `serve`: starts the pool, serves the API on a bound listener until `shutdown` fires (one
//! during start-up ends the start-up and closes the listener), then
//! answers `/ready` with 503 for `worker.shutdown_drain_ms` (load balancers stop sending),
//! drains in-flight requests (bounded) and tears the pool down. `main` and the tests both
//! call it. Every request gets an id (`x-request-id`, kept when the client sent one) and a
//! tracing span carrying it, so each log line of a request names it.

mod report;
mod request_id;
mod settings;
mod stalled_body;
mod unread_body;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::LatencyUnit;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::api::{self, AppState};
use crate::auth::{KeyRing, KeysError};
use crate::cluster::{Cluster, ClusterError};
use crate::config::{Config, ConfigError};
use crate::files::{self, StoreError};
use crate::generation::{GenerationInfo, Rollovers};
use crate::live::{Live, LiveCell};
use crate::metrics::Metrics;
use crate::packages::Packages;
use crate::pool::{Pool, PoolError};
use crate::sessions::Sessions;
use crate::shutdown::{stopped_while_starting, until_requested};
use crate::tools::ToolContext;
pub use report::build_info;
use report::log_sandbox;
use request_id::{drop_unfit_request_id, request_span};
use settings::prepare_mpl_config_dir;
use stalled_body::StalledBody;

/// How long the runs killed at the end of the shutdown grace period have to send their
/// answers (which say why they ended) before the process exits: they are sent within
/// milliseconds, but a killed run may wait up to 2 s for its worker's exit status.
const ANSWER_KILLED_RUNS: Duration = Duration::from_secs(3);
pub use settings::{load_keys, open_store, pool_settings, session_settings};

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
    prepare_mpl_config_dir(&settings.tiers[0].zygote.mpl_config_dir)?;
    metrics.set_tenants(keys.load().names());
    // Answer at once while the lightest tier's zygote starts (503, Retry-After, what is
    // happening); the real router takes over when the pool has started (the fuller tiers
    // come up behind it).
    let router_cell = api::starting::RouterCell::default();
    let what = format!(
        "the zygote of its lightest tier ({}) is preloading its modules",
        settings.tiers[0].name
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
    let mut server = tokio::spawn(listen(
        listener,
        api::starting::until_ready(router_cell.clone(), what, settings.size),
        stop.clone(),
        Duration::from_millis(config.limits.client_timeout_ms),
    ));
    let pool_started = std::time::Instant::now();
    // The environment's stamp (tens of milliseconds of directory reads), the cluster's
    // HTTP client (the platform's CA certificates read and parsed: 3 ms warm, 45 ms from
    // a cold page cache) and the file store (a local one reads its whole index: seconds
    // with a million files) are made while the zygotes start, not before or after: they
    // are off the path to ready, and the listener answers `starting` meanwhile.
    let opening = tokio::task::spawn_blocking({
        let config = config.clone();
        let metrics = metrics.clone();
        move || open_store(&config, metrics)
    });
    let starting = async {
        tokio::join!(
            crate::generation::stamp::EnvStamp::read_off_thread(&config),
            Pool::start_observed(settings, metrics.clone()),
            Cluster::new_off_thread(&config.cluster),
            opening,
        )
    };
    // Given up, the start-up's zygotes are killed with it (`kill_on_drop`, and their
    // `PR_SET_PDEATHSIG` once this process exits) and its workspace root is removed (the
    // root's guard is dropped with the start-up). A start-up that fails past this point
    // shuts the pool down, which does the same.
    let Some((environment, started, cluster, store)) = until_requested(starting, &requested).await
    else {
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
    let store = match store.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
        Ok(store) => store,
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
    // Without host tools: each caller's descriptions name those it may call
    // (`AppState::tool_context_for`).
    let tool_context = ToolContext::new(&config, info.python_version.clone(), packages.installed());
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
        .layer(axum::middleware::map_request(drop_unfit_request_id))
        .layer(axum::middleware::from_fn(unread_body::keep_or_close));

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
    let killing = tokio::select! {
        result = &mut server => {
            result.map_err(std::io::Error::other)??;
            false
        }
        () = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "in-flight requests did not finish within the grace period; killing their workers");
            true
        }
    };
    pool.shutdown().await;
    if killing
        && tokio::time::timeout(ANSWER_KILLED_RUNS, server)
            .await
            .is_err()
    {
        tracing::warn!("some connections were still open after the killed runs' answers");
    }
    tracing::info!("snakecage stopped");
    Ok(())
}

/// Serves `app` on `listener` until `stop` fires, then lets in-flight requests finish.
///
/// A client gets `client_timeout` to send a request's headers (from the connection's
/// start, or from its previous answer: an idle kept-alive connection is closed then), and
/// a request body it sends may stall no longer between two pieces: a client that opens
/// connections and sends nothing, or a byte now and then, cannot hold the service's
/// descriptors for good (axum's own `serve` sets no timer, so hyper never timed out).
async fn listen(
    listener: TcpListener,
    app: axum::Router,
    stop: CancellationToken,
    client_timeout: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::ServiceExt;
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(client_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let service = app.map_request(move |request: axum::http::Request<hyper::body::Incoming>| {
        request.map(|body| axum::body::Body::new(StalledBody::new(body, client_timeout)))
    });
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors (or a connection reset before it was taken):
                    // the next accept may work once connections close.
                    tracing::warn!(error = %e, "could not accept a connection");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // No Nagle: a streamed event (or any response written in more than one piece)
        // must leave at once, not wait for the client's delayed ACK of the previous write.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a connection");
        }
        let hyper_service = hyper_util::service::TowerToHyperService::new(service.clone());
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            // hyper's timer starts when it reads a request's head; before the first one
            // the auto builder waits, with no timer, for the bytes that tell HTTP/1 from
            // HTTP/2. A connection that sends nothing is closed here.
            let mut first = [0u8; 1];
            if tokio::time::timeout(client_timeout, tcp.peek(&mut first))
                .await
                .is_err()
            {
                return;
            }
            let connection =
                builder.serve_connection_with_upgrades(TokioIo::new(tcp), hyper_service);
            if let Err(e) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(error = %e, "a connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// How long the accept loop waits after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
