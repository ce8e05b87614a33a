//! The HTTP surface: the router and one module per group of routes.

pub mod admin;
mod agents;
mod body_limit;
mod byte_range;
mod code_field;
mod content_encoding;
pub(crate) mod error_bodies;
mod execute;
mod files;
mod health;
mod json;
mod metrics;
mod nullable;
mod runs;
mod session_run;
mod sessions;
pub mod starting;
mod status;
mod stream;
mod timeout;
mod upload_name;
mod whole_number;

pub(crate) use json::json_kind;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use crate::sessions::Sessions;

use crate::auth::{self, KeyRing};
use crate::cluster::{self, Cluster};
use crate::config::Config;
use crate::files::SharedStore;
use crate::generation::{GenerationInfo, Rollovers};
use crate::live::LiveCell;
use crate::mcp;
use crate::metrics::{self as service_metrics, Metrics};
use crate::packages::Packages;
use crate::pool::Pool;
use crate::tools::ToolContext;

/// What every handler can reach.
pub struct AppState {
    /// The generation serving now: its configuration, packages and tool descriptions
    /// (swapped whole at a rollover; read it with [`AppState::config`] and friends).
    pub live: Arc<LiveCell>,
    /// The rollover in progress, if one is (one at a time).
    pub rollovers: Rollovers,
    pub pool: Pool,
    pub store: SharedStore,
    /// Whether the file store can serve, as its last background check found (`/health`).
    pub store_watch: Arc<crate::files::watch::StoreWatch>,
    pub sessions: Sessions,
    /// The operator's tools for sandboxed code (Code Mode), scoped per API key.
    pub catalog: Arc<crate::codemode::Catalog>,
    /// Runs in progress, by id (cancel, answer a tool call).
    pub runs: Arc<crate::runs::Runs>,
    pub metrics: Arc<Metrics>,
    /// The API keys in force (none: no authentication); a reload re-reads the keys file.
    pub keys: Arc<KeyRing>,
    /// This replica's place in a cluster (which replica owns a session).
    pub cluster: Arc<Cluster>,
    /// Operator package management: environment generations and their manifest.
    pub envs: Arc<crate::envs::EnvManager>,
    /// Fires when shutdown begins: from then on `/ready` answers 503.
    pub stopping: CancellationToken,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    /// The configuration of the generation serving now.
    pub fn config(&self) -> Arc<Config> {
        self.live.load().config.clone()
    }

    /// What user code of the generation serving now may import.
    pub fn packages(&self) -> Arc<Packages> {
        self.live.load().packages.clone()
    }

    /// What the tool descriptions say now (without the caller's own host tools).
    pub fn tool_context(&self) -> Arc<ToolContext> {
        self.live.load().tool_context.clone()
    }

    /// [`Self::tool_context`] as `owner` sees it: its descriptions name the host tools
    /// that caller's code may call, those limited to it (`tenants`) among them.
    pub fn tool_context_for(&self, owner: Option<&str>) -> Arc<ToolContext> {
        let code_tools = self.catalog.described_to(owner);
        Arc::new(self.tool_context().with_code_tools(code_tools))
    }

    /// The generation serving now.
    pub fn generation(&self) -> GenerationInfo {
        self.live.load().generation.clone()
    }
}

pub fn router(state: SharedState) -> Router {
    let config = state.config();
    let body_limit = config.limits.max_request_bytes;
    // Uploads are bounded by the file store, which answers 413 past the maximum file size;
    // the body limit only stops other multipart fields a little after that.
    let upload_limit = usize::try_from(config.files.max_file_size_mb << 20)
        .unwrap_or(usize::MAX)
        .saturating_add(1 << 20);
    // An answer to a caller tool's call carries a result of up to `tools.max_result_bytes`,
    // whatever `max_request_bytes` is; JSON that escapes non-ASCII (`\u00fc`) is up to
    // three times the result's own UTF-8 bytes.
    let answer_limit = body_limit.max(
        config
            .tools
            .max_result_bytes
            .saturating_mul(3)
            .saturating_add(64 << 10),
    );
    let metrics = state.metrics.clone();
    let require_key = middleware::from_fn_with_state(state.keys.clone(), auth::require_key);
    // Inside the key check: a call is authenticated here before it is forwarded.
    let forward = middleware::from_fn_with_state(state.clone(), cluster::forward::middleware);
    let json_routes = Router::new()
        .route("/", get(status::page))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/status", get(status::status))
        .route("/v1/packages", get(agents::packages))
        .route("/v1/tools", get(agents::tools))
        .route("/v1/tools/catalog", get(runs::catalog))
        .route("/v1/runs/{run_id}", axum::routing::delete(runs::cancel_run))
        .route("/v1/execute", post(execute::execute))
        .route("/v1/execute/stream", post(execute::execute_stream))
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/v1/sessions/{session_id}",
            get(sessions::get).delete(sessions::delete),
        )
        .route(
            "/v1/sessions/{session_id}/execute",
            post(session_run::execute),
        )
        .route(
            "/v1/sessions/{session_id}/execute/stream",
            post(session_run::execute_stream),
        )
        .route("/v1/sessions/{session_id}/reset", post(sessions::reset))
        .route("/v1/sessions/{session_id}/bash", post(sessions::bash))
        .route(
            "/v1/files/{file_id}",
            get(files::download).delete(files::delete),
        )
        .nest("/v1/admin", admin::routes())
        .fallback(health::not_found);
    let answers = Router::new().route(
        "/v1/runs/{run_id}/tool_calls/{call_id}",
        post(runs::answer_tool_call),
    );
    // Not refused by its `Content-Length`: an upload over the maximum file size is larger
    // than `server::unread_body` drains, so a refusal before it is read would close the
    // connection under a client still sending it (most do not wait for `100 Continue`),
    // which would see a reset instead of the 413. The store reads it up to the maximum.
    let uploads = Router::new()
        .route("/v1/files", post(files::upload).get(files::list))
        .layer(DefaultBodyLimit::max(upload_limit));
    // Each group bounded on its own, then merged: a layer on the merged router would
    // bound every route by one limit.
    let api = body_limit::bounded(json_routes, &state, body_limit, json::body_too_large)
        .merge(body_limit::bounded(
            answers,
            &state,
            answer_limit,
            runs::answer_too_large,
        ))
        .merge(uploads)
        .with_state(state.clone())
        .layer(forward)
        .layer(middleware::from_fn(content_encoding::refuse_encoded_bodies))
        .layer(require_key.clone());
    // MCP tool calls are carried out through the routes above (and counted there), with the
    // caller's `Authorization` header: the same key, the same tenant, the same scoping.
    let for_caller = state.clone();
    let mcp = mcp::Endpoint::new(
        api.clone(),
        Arc::new(move |owner| for_caller.tool_context_for(owner)),
        config.mcp.allowed_hosts.clone(),
        body_limit,
    );
    let app = api
        .layer(middleware::from_fn(error_bodies::json_errors))
        // `/mcp` itself, not every path below it (`/mcp/x` is no endpoint: 404).
        .route_service(
            "/mcp",
            tower::ServiceBuilder::new()
                .layer(middleware::from_fn(mcp::http::json_errors))
                .layer(require_key)
                .layer(middleware::from_fn(content_encoding::refuse_encoded_bodies))
                .layer(middleware::from_fn_with_state(mcp.guard, mcp::http::guard))
                .service(mcp.service),
        )
        .layer(middleware::from_fn_with_state(
            metrics,
            service_metrics::http::count_requests,
        ));
    // A layer of `app` runs before the router adds a 405's `Allow` header: this one, around
    // all of it, sees the header and names the methods to use.
    Router::new()
        .fallback_service(app)
        .layer(middleware::from_fn(error_bodies::name_allowed_methods))
}
