//! Stopping: the SIGTERM/SIGINT future `main` hands to [`crate::server::serve`], and the
//! start-up steps that give way to it.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::server::ServeError;

/// `start` (a step of the start-up), or `None` once a shutdown has been requested.
pub(crate) async fn until_requested<T>(
    start: impl Future<Output = T>,
    requested: &CancellationToken,
) -> Option<T> {
    tokio::select! {
        done = start => Some(done),
        () = requested.cancelled() => None,
    }
}

/// Closes the listener (which served only 503 `not_ready` so far) after a shutdown was
/// requested during start-up.
pub(crate) async fn stopped_while_starting(
    stop: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
) -> Result<(), ServeError> {
    tracing::info!("shutdown requested while starting; stopped before serving");
    stop.cancel();
    let _ = server.await;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed by this call, not when the
/// future is first polled: until then a SIGTERM would end the process at once, or, when it
/// runs as PID 1 of a PID namespace (a container without an init), be discarded by the
/// kernel and lost for good. Call it before anything that can take time.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
    }
}
