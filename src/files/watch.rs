//! `StoreWatch`: whether the file store can serve, as a background check last found it.
//!
//! Every replica of a cluster shares the store, so its trouble is not a reason to take a
//! replica out of a load balancer (`/ready` would drop them all, and code that needs no
//! file would stop running too). `/health` reports it instead, without waiting on the
//! store: a liveness probe must not hang on an object store that hangs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{SharedStore, StoreError};

/// How often the store is checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How long one check waits for the store's answer.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// What the last check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "detail", rename_all = "snake_case")]
pub enum StoreState {
    /// Not checked yet (the first check runs at start-up).
    Unchecked,
    Ok,
    /// The store could not serve the check: its error.
    Unavailable(String),
}

/// The file store's state for `/health`, refreshed by [`StoreWatch::spawn`].
pub struct StoreWatch {
    state: Mutex<StoreState>,
    /// Whether the last listing for the metrics failed (so that an outage is logged once,
    /// not on every scrape).
    usage_failing: AtomicBool,
}

impl Default for StoreWatch {
    fn default() -> Self {
        Self {
            state: Mutex::new(StoreState::Unchecked),
            usage_failing: AtomicBool::new(false),
        }
    }
}

impl StoreWatch {
    /// Checks `store` now and then every `interval` until `stop` fires.
    pub fn spawn(store: SharedStore, interval: Duration, stop: CancellationToken) -> Arc<Self> {
        let watch = Arc::new(Self::default());
        let this = watch.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = stop.cancelled() => return,
                }
                let state = check(&store, CHECK_TIMEOUT).await;
                this.set(state);
            }
        });
        watch
    }

    /// What the last check found.
    pub fn state(&self) -> StoreState {
        self.state.lock().expect("store state lock").clone()
    }

    /// Records how listing the store for the metrics (every scrape of `/metrics` and every
    /// refresh of the status page) went, and logs only the changes: a warning when it
    /// starts failing, an info line when it works again. Returns whether it logged.
    pub fn usage_listed(&self, result: Result<(), &StoreError>) -> bool {
        let failing = result.is_err();
        if self.usage_failing.swap(failing, Ordering::Relaxed) == failing {
            return false;
        }
        match result {
            Err(error) => tracing::warn!(
                %error,
                "listing the file store for the metrics failed"
            ),
            Ok(()) => tracing::info!("listing the file store for the metrics works again"),
        }
        true
    }

    fn set(&self, state: StoreState) {
        let mut current = self.state.lock().expect("store state lock");
        match (&*current, &state) {
            (StoreState::Unavailable(_), StoreState::Ok) => {
                tracing::info!("the file store is reachable again");
            }
            (StoreState::Unchecked | StoreState::Ok, StoreState::Unavailable(error)) => {
                tracing::warn!(%error, "the file store is unavailable; file requests get 503");
            }
            _ => {}
        }
        *current = state;
    }
}

/// One check of `store`, bounded by `timeout`.
pub async fn check(store: &SharedStore, timeout: Duration) -> StoreState {
    match tokio::time::timeout(timeout, store.check()).await {
        Ok(Ok(())) => StoreState::Ok,
        Ok(Err(e)) => StoreState::Unavailable(e.to_string()),
        Err(_) => StoreState::Unavailable(format!(
            "the file store did not answer within {} ms",
            timeout.as_millis()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_reads_as_health_reports_it() {
        let json = |s: StoreState| serde_json::to_value(s).unwrap();
        assert_eq!(json(StoreState::Ok), serde_json::json!({"state": "ok"}));
        assert_eq!(
            json(StoreState::Unavailable("NoSuchBucket: é".into())),
            serde_json::json!({"state": "unavailable", "detail": "NoSuchBucket: é"})
        );
        let watch = StoreWatch::default();
        assert_eq!(watch.state(), StoreState::Unchecked);
        watch.set(StoreState::Unavailable("down".into()));
        watch.set(StoreState::Ok);
        assert_eq!(watch.state(), StoreState::Ok);
    }

    #[test]
    fn a_failing_listing_is_logged_when_it_starts_and_when_it_ends_only() {
        let watch = StoreWatch::default();
        let down = StoreError::Unavailable {
            doing: "listing files",
            detail: "connection refused".into(),
        };
        let logged: Vec<bool> = [Ok(()), Err(&down), Err(&down), Err(&down), Ok(()), Ok(())]
            .into_iter()
            .map(|r| watch.usage_listed(r))
            .collect();
        assert_eq!(logged, [false, true, false, false, true, false]);
    }
}
