//! SIGHUP: the usual reload signal (systemd's `ExecReload=kill -HUP $MAINPID`) runs the
//! reload `POST /v1/admin/reload` runs (not forced), and logs that SIGHUP asked and how it
//! ended: rolled over, nothing changed, or refused with the reason. The service never
//! exits on SIGHUP: a reload already in progress is logged, and a refused one leaves the
//! serving generation (and the API keys) as they were.

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::api::SharedState;
use crate::api::admin::reload::reload_service;

/// SIGHUP, caught from the moment [`reload_signal`] was called: one that arrives while the
/// service starts is kept and handled once it serves.
#[derive(Debug)]
pub struct ReloadSignal(Signal);

/// Installs the SIGHUP handler now (without one, SIGHUP ends the process). Call it before
/// anything that can take time, as [`crate::shutdown::shutdown_signal`].
pub fn reload_signal() -> ReloadSignal {
    ReloadSignal(signal(SignalKind::hangup()).expect("installing the SIGHUP handler"))
}

/// Reloads on every SIGHUP until `stop` fires, one reload at a time (signals that arrive
/// during one are coalesced into the next).
pub(crate) fn spawn(mut hangups: ReloadSignal, state: SharedState, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                received = hangups.0.recv() => if received.is_none() { return },
                () = stop.cancelled() => return,
            }
            tracing::info!("SIGHUP received: reloading the configuration and the API keys");
            match reload_service(&state, false, "SIGHUP").await {
                Ok(answer) if answer.rolled_over => tracing::info!(
                    generation = answer.generation.id,
                    keys = answer.keys.as_ref().map(|k| k.summary()),
                    "reload asked by SIGHUP: rolled over to a new generation"
                ),
                Ok(answer) => tracing::info!(
                    generation = answer.generation.id,
                    detail = answer.message.as_deref().unwrap_or_default(),
                    "reload asked by SIGHUP: no new generation"
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "reload asked by SIGHUP refused; the serving generation and the API keys stay as they were"
                ),
            }
        }
    });
}
