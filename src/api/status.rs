//! The live status page: `GET /` serves one self-contained HTML file (inline CSS and JS, no
//! external assets), which polls `GET /v1/status`, a JSON summary read from the same
//! counters `/metrics` exports.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use serde::Serialize;
use snakecage_worker::protocol::PreloadedModule;

use super::SharedState;
use crate::metrics::labels::{Kind, Outcome};
use crate::metrics::recent::{Failure, Percentiles};
use crate::pool::{PoolStatus, WorkspaceUsage};

const PAGE: &str = include_str!("status.html");

pub async fn page() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Html(PAGE))
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub python_version: String,
    /// The zygote generation serving: id, why it started, when.
    pub generation: crate::generation::GenerationInfo,
    pub executions: Executions,
    /// Over the last executions that ran (at most `latency.window`).
    pub latency: Percentiles,
    pub pool: PoolStatus,
    pub sessions_active: i64,
    /// Code Mode: tool calls made so far, and runs waiting on a caller's answer now.
    pub tools: ToolActivity,
    pub sandbox_layers: Vec<String>,
    /// The file store as `/health` reports it: `backend`, `state` (`ok`, `unavailable`
    /// with the store's error in `detail`, `unchecked`) and, once a local store's directory
    /// had to be recreated, `last_recovery`.
    pub file_store: serde_json::Value,
    /// The workspace file system as `/health` reports it (`bounded`, `unbounded_because`,
    /// bytes and inodes with their use, `nearly_full`); `null` when it cannot be read.
    pub workspace: Option<WorkspaceUsage>,
    /// The memory of all workers together as `/health` reports it (`limit_bytes`,
    /// `used_bytes`, `oom_kills`); `null` where nothing bounds it.
    pub workers_memory: Option<crate::pool::cgroup::WorkersMemory>,
    /// Third-party packages user code can import (installed ones), with their versions: the
    /// same list as `GET /v1/packages`.
    pub packages: Vec<PreloadedModule>,
    /// The last failed or shed executions, newest first.
    pub recent_failures: Vec<Failure>,
}

#[derive(Debug, Serialize)]
pub struct ToolActivity {
    pub calls: u64,
    pub runs_waiting: usize,
    /// Operator tools configured (HTTP and upstream MCP).
    pub configured: usize,
}

#[derive(Debug, Serialize)]
pub struct Executions {
    /// Every execution, shed ones included.
    pub total: u64,
    pub ok: u64,
    /// `ok / total`; `null` before the first execution.
    pub success_rate: Option<f64>,
    /// Per outcome (ok, error, timeout, memory_limit, output_limit, killed, rejected),
    /// every kind together.
    pub by_outcome: BTreeMap<&'static str, u64>,
    pub by_kind: BTreeMap<&'static str, u64>,
}

pub async fn status(State(state): State<SharedState>) -> Json<Status> {
    super::metrics::observe(&state).await;
    let metrics = &state.metrics;
    let mut by_outcome = BTreeMap::new();
    let mut by_kind = BTreeMap::new();
    for outcome in Outcome::ALL {
        for kind in Kind::ALL {
            let n = metrics.executions(kind, outcome);
            *by_outcome.entry(outcome.as_str()).or_insert(0) += n;
            *by_kind.entry(kind.as_str()).or_insert(0) += n;
        }
    }
    let total: u64 = by_outcome.values().sum();
    let ok = by_outcome[Outcome::Ran(crate::pool::run::RunVerdict::Ok).as_str()];
    let zygote = state.pool.zygote_info();
    Json(Status {
        version: env!("CARGO_PKG_VERSION"),
        python_version: zygote.python_version,
        generation: state.generation(),
        executions: Executions {
            total,
            ok,
            success_rate: (total > 0).then(|| ok as f64 / total as f64),
            by_outcome,
            by_kind,
        },
        latency: metrics.recent().percentiles(),
        pool: state.pool.status(),
        sessions_active: metrics.sessions_active(),
        tools: ToolActivity {
            calls: metrics.tool_calls_total(),
            runs_waiting: state.runs.waiting_on_caller(),
            configured: state.catalog.names().len(),
        },
        sandbox_layers: metrics.build().sandbox_layers,
        file_store: super::health::file_store(&state, state.store_watch.state()),
        workspace: state.pool.workspace_usage(),
        workers_memory: state.pool.workers_memory(),
        packages: state
            .packages()
            .installed()
            .into_iter()
            .map(|(name, version)| PreloadedModule { name, version })
            .collect(),
        recent_failures: metrics.recent().failures(),
    })
}
