//! `GET /metrics`: the Prometheus text exposition format.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::SharedState;
use crate::metrics::StoreUsage;
use crate::metrics::health::HealthReport;

/// The content type of the text format, version 0.0.4.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn metrics(State(state): State<SharedState>) -> impl IntoResponse {
    observe(&state).await;
    (
        [(header::CONTENT_TYPE, TEXT_FORMAT)],
        state.metrics.encode(),
    )
}

/// Reads the state gauges (pool, file store, memory, health) into the metrics.
pub async fn observe(state: &SharedState) {
    let listed = state.store.list_all().await;
    // Logged once per outage, not on every scrape.
    state.store_watch.usage_listed(listed.as_ref().map(drop));
    let (charge, _) = state.store.charging();
    let usage = listed.ok().map(|files| StoreUsage {
        files: files.len() as u64,
        bytes: files.iter().map(|f| charge.of(f.size_bytes)).sum(),
    });
    state.metrics.observe(&state.pool.status(), usage);
    let zygote = state.pool.zygote_info();
    let quota_mb = state.config().files.quota_mb;
    state.metrics.observe_health(&HealthReport {
        ready: super::health::not_ready(state).is_none(),
        file_store_available: !matches!(
            state.store_watch.state(),
            crate::files::watch::StoreState::Unavailable(_)
        ),
        sandbox: &zygote.sandbox,
        files_quota_bytes: (quota_mb > 0).then(|| quota_mb.saturating_mul(1 << 20)),
        workspace: state.pool.workspace_usage(),
        workers_memory: state.pool.workers_memory(),
    });
}
