//! `serve`: starts the pool, serves the API on a bound listener until `shutdown` fires, then
//! drains in-flight requests (bounded) and tears the pool down. `main` and the tests both
//! call it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use snakecage_worker::protocol::{LayerReport, LayerState, WorkerLimits, ZygoteConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::api::{self, AppState};
use crate::config::{Config, ConfigError};
use crate::pool::{Pool, PoolError, PoolSettings};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("starting the worker pool: {0}")]
    Pool(#[from] PoolError),
    #[error("serving HTTP: {0}")]
    Io(#[from] std::io::Error),
}

/// The pool settings a configuration implies.
pub fn pool_settings(config: &Config) -> Result<PoolSettings, ConfigError> {
    let layout = config.python.layout()?;
    let state_dir = &config.worker.state_dir;
    let limits = &config.limits;
    Ok(PoolSettings {
        size: config.pool.size,
        queue_length: config.pool.queue_length,
        queue_timeout: Duration::from_millis(config.pool.queue_timeout_ms),
        spawn_timeout: Duration::from_millis(config.pool.spawn_timeout_ms),
        worker_binary: config.worker_binary(),
        workspace_root: state_dir.join(format!("workspaces-{}", std::process::id())),
        zygote: ZygoteConfig {
            python_home: layout.home,
            site_packages: layout.site_packages,
            preload: config.python.preload.clone(),
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
        },
        require: config.sandbox.require.clone(),
    })
}

pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let settings = pool_settings(&config)?;
    std::fs::create_dir_all(&settings.zygote.mpl_config_dir)?;
    let pool = Pool::start(settings).await?;
    let info = pool.zygote_info();
    tracing::info!(
        addr = %listener.local_addr()?,
        python = %info.python_version,
        preloaded = ?info.preloaded.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        "snakecage is listening"
    );
    for failure in &info.preload_failures {
        tracing::warn!(%failure, "a configured preload module is not available");
    }
    log_sandbox(&info.sandbox);
    let grace = Duration::from_millis(config.worker.shutdown_grace_ms);
    let state = Arc::new(AppState {
        config,
        pool: pool.clone(),
    });
    let app = api::router(state)
        .layer(TraceLayer::new_for_http())
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid));

    let stop = CancellationToken::new();
    let stop_signal = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop_signal.cancel();
    });
    let graceful = stop.clone();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move { graceful.cancelled().await });
    tokio::select! {
        result = server => result?,
        () = async { stop.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "in-flight requests did not finish within the grace period; killing their workers");
        }
    }
    pool.shutdown().await;
    tracing::info!("snakecage stopped");
    Ok(())
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

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
