//! The MCP server at `/mcp` (Model Context Protocol over streamable HTTP, with `rmcp`).
//!
//! Its tools are [`crate::tools`]'s catalog, and each call is carried out by sending the
//! HTTP request the call maps to through the API router: the same validation, limits and
//! errors as for direct API clients. Failures of the user's code are tool results with
//! `isError: true` and the traceback; only malformed calls are protocol errors.
//!
//! `/mcp` is stateless: it keeps no MCP session, so any replica behind a round-robin load
//! balancer answers any request of a client (rmcp's stateless mode: each POST is served on
//! its own, its answer streamed back on that POST). A call stops its run when its client
//! goes away or cancels it ([`calls`]); [`http`] holds the HTTP layer rmcp leaves to us.
//!
//! - [`results`]: an API answer turned into what the model sees.
//! - [`calls`]: the calls in flight, so a `notifications/cancelled` finds its call.
//! - [`http`]: the Host check, the body limit, JSON error bodies, the client's token.
//! - [`gone_client`]: rmcp's ERROR for an answer whose client left, kept out of the log.

pub mod calls;
pub mod gone_client;
pub mod http;
mod results;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CustomRequest, CustomResult, ErrorCode,
    Implementation, InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::Value;
use tower::ServiceExt;
use tower_http::request_id::RequestId;

use self::calls::{Client, InFlight};
use self::results::tool_result;
use crate::tools::{self, ToolCallError, ToolContext};

/// The header of a request's id (set on every request in front of the router).
const X_REQUEST_ID: &str = "x-request-id";

/// Largest API answer a tool call reads (a run's response with its rich outputs).
const MAX_TOOL_RESPONSE: usize = 64 << 20;

/// The tool descriptions' context of the generation serving now, as the caller (its API
/// key's tenant, if any) sees it: read at each listing, so a rollover shows at once.
pub type LiveContext = Arc<dyn Fn(Option<&str>) -> Arc<ToolContext> + Send + Sync>;

/// The tenant of the MCP request's API key: the key check in front of `/mcp` put it in
/// the HTTP request's extensions, which the streamable HTTP transport hands on.
fn caller_of(context: &RequestContext<RoleServer>) -> Option<&str> {
    context
        .extensions
        .get::<axum::http::request::Parts>()?
        .extensions
        .get::<crate::auth::Caller>()?
        .owner()
}

/// A call the client cancelled (or left): the answer no one reads, which ends its stream.
/// MCP names no code for it; this is JSON-RPC's "request cancelled" of LSP.
const REQUEST_CANCELLED: ErrorCode = ErrorCode(-32800);

/// The handler of every MCP request; cheap to clone.
#[derive(Clone)]
pub struct McpServer {
    api: Router,
    context: LiveContext,
    calls: Arc<InFlight>,
}

impl McpServer {
    pub fn new(api: Router, context: LiveContext, calls: Arc<InFlight>) -> Self {
        Self {
            api,
            context,
            calls,
        }
    }

    /// Sends the request a tool call maps to through the API; returns status and JSON body.
    /// `authorization` is the MCP request's own header, so the call is made as its caller;
    /// `request_id` is the MCP request's id, so the run is recorded under it (the status
    /// page's failures, the metrics' exemplars) as a REST request's run is.
    async fn call_api(
        &self,
        name: &str,
        arguments: &Value,
        authorization: Option<&HeaderValue>,
        request_id: Option<&RequestId>,
    ) -> Result<(StatusCode, Value), McpError> {
        let invalid = |e: ToolCallError| McpError::invalid_params(e.to_string(), None);
        // The caller's own tools change only the descriptions, not the call's mapping.
        let spec = tools::catalog(&(self.context)(None))
            .into_iter()
            .find(|spec| spec.name == name)
            .ok_or_else(|| invalid(ToolCallError::UnknownTool(name.to_owned())))?;
        tools::check_arguments(&spec, arguments).map_err(invalid)?;
        let call = tools::request(name, arguments).map_err(invalid)?;
        let mut builder = Request::builder().method(call.method).uri(call.path);
        if let Some(value) = authorization {
            builder = builder.header(header::AUTHORIZATION, value);
        }
        let body = match call.body {
            Some(json) => {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
                Body::from(json.to_string())
            }
            None => Body::empty(),
        };
        if let Some(id) = request_id {
            builder = builder
                .header(X_REQUEST_ID, id.header_value())
                .extension(id.clone());
        }
        let request = builder.body(body).map_err(internal)?;
        let response = self.api.clone().oneshot(request).await.map_err(internal)?;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), MAX_TOOL_RESPONSE)
            .await
            .map_err(internal)?;
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok((status, json))
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("snakecage", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Runs Python in an isolated sandbox. Use run_python for one-off code and a Python \
                 session (create_python_session, run_in_session, close_python_session) when state \
                 must persist. Print what you want to see.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = tools::catalog(&(self.context)(caller_of(&context)))
            .iter()
            .map(|spec| {
                let schema: JsonObject = match &spec.input_schema {
                    Value::Object(map) => map.clone(),
                    _ => JsonObject::new(),
                };
                Tool::new(spec.name, spec.description.clone(), Arc::new(schema))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        // The streamable HTTP transport puts the HTTP request's parts in the context.
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let headers = parts.map(|parts| &parts.headers);
        let request_id = parts.and_then(|parts| parts.extensions.get::<RequestId>());
        let authorization = headers.and_then(|h| h.get(header::AUTHORIZATION));
        // rmcp cancels `context.ct` when the client goes away (the response stream is
        // dropped); a `notifications/cancelled` of the client cancels it through `calls`.
        let _in_flight = headers.and_then(Client::of).map(|client| {
            let id = serde_json::to_string(&context.id).unwrap_or_default();
            self.calls.register(client, id, context.ct.clone())
        });
        // Dropping the API call drops its handler, which kills the run's worker at once
        // (counted as abandoned), as for a REST client that leaves.
        tokio::select! {
            biased;
            () = context.ct.cancelled() => {
                // Normal: the client left or gave up. Its answer may have no one to go to
                // (rmcp's ERROR for that is dropped: `gone_client`).
                tracing::info!(
                    tool = %request.name,
                    "an MCP call ended by its client (it left or cancelled the call): its run is stopped"
                );
                Err(McpError::new(
                    REQUEST_CANCELLED,
                    format!("{}: the call was cancelled and its run stopped", request.name),
                    None,
                ))
            }
            answer = self.call_api(&request.name, &arguments, authorization, request_id) => {
                let (status, body) = answer?;
                Ok(tool_result(&request.name, status, &body).into())
            }
        }
    }

    /// A request rmcp could not read as the method it names lands here: for a known method
    /// its params have the wrong shape (-32602, saying what is wrong), otherwise the method
    /// does not exist (-32601).
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        Err(malformed_request(&request.method, request.params.as_ref()))
    }
}

/// A failure of the service in carrying out a call, logged here: rmcp's own line for an
/// error answer is filtered out with the clients' mistakes (see `main`'s log filter).
fn internal(e: impl std::fmt::Display) -> McpError {
    tracing::error!(error = %e, "an MCP tool call failed inside the service");
    McpError::internal_error(e.to_string(), None)
}

/// The error for a request whose params rmcp could not read (or whose method is unknown).
fn malformed_request(method: &str, params: Option<&Value>) -> McpError {
    const KNOWN: &[&str] = &[
        "initialize",
        "ping",
        "tools/list",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "logging/setLevel",
    ];
    if method == "tools/call" {
        return McpError::invalid_params(tools_call_problem(params), None);
    }
    if KNOWN.contains(&method) {
        return McpError::invalid_params(
            format!("{method}: its params do not have the shape the method takes"),
            None,
        );
    }
    McpError::new(
        ErrorCode::METHOD_NOT_FOUND,
        format!("method not found: {method}"),
        None,
    )
}

/// What is wrong with the params of a `tools/call` rmcp could not read.
fn tools_call_problem(params: Option<&Value>) -> String {
    let kind = crate::api::json_kind;
    let Some(Value::Object(params)) = params else {
        return format!(
            "tools/call: params must be an object {{\"name\": <tool>, \"arguments\": {{...}}}}, \
             not {}",
            params.map_or("missing", kind)
        );
    };
    match (params.get("name"), params.get("arguments")) {
        (Some(Value::String(_)), Some(arguments))
            if !matches!(arguments, Value::Object(_) | Value::Null) =>
        {
            format!(
                "tools/call: `arguments` must be a JSON object of the tool's arguments (e.g. \
                 {{\"code\": \"print(1)\"}}), not {}",
                kind(arguments)
            )
        }
        (Some(Value::String(_)), _) => {
            "tools/call: params must be {\"name\": <tool>, \"arguments\": {...}}".to_owned()
        }
        (Some(other), _) => format!(
            "tools/call: `name` must be the tool's name (a string), not {}",
            kind(other)
        ),
        (None, _) => "tools/call: `name` (the tool to call) is missing".to_owned(),
    }
}

/// `/mcp`: the rmcp service and the state its HTTP layer ([`http::guard`]) shares with it.
pub struct Endpoint {
    pub service: StreamableHttpService<McpServer, NeverSessionManager>,
    pub guard: Arc<http::Guard>,
}

impl Endpoint {
    /// `allowed_hosts`: the `Host` values `/mcp` answers (`mcp.allowed_hosts`);
    /// `max_request_bytes`: the largest body it reads (`limits.max_request_bytes`).
    pub fn new(
        api: Router,
        context: LiveContext,
        allowed_hosts: Vec<String>,
        max_request_bytes: usize,
    ) -> Self {
        let calls = Arc::new(InFlight::default());
        let server = McpServer::new(api, context, calls.clone());
        // Stateless: no session to find on one replica. JSON answers stay SSE streams, whose
        // keep-alive comments keep a long run's connection open through proxies. No
        // cancellation token: a call in flight at shutdown finishes within the grace period,
        // as a REST request does (there are no standing GET streams to end).
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_allowed_hosts(allowed_hosts.clone())
            .with_max_request_body_bytes(max_request_bytes);
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        Self {
            service,
            guard: Arc::new(http::Guard::new(allowed_hosts, max_request_bytes, calls)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tools_call_rmcp_could_not_read_is_invalid_params_saying_what_is_wrong() {
        let problem = |params: Value| {
            let e = malformed_request("tools/call", Some(&params));
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
            e.message.into_owned()
        };
        assert!(
            problem(json!({"name": "run_python", "arguments": "print('é')"}))
                .contains("`arguments` must be a JSON object of the tool's arguments")
        );
        assert!(problem(json!({"name": 7})).contains("`name` must be the tool's name"));
        assert!(problem(json!({"arguments": {}})).contains("`name` (the tool to call) is missing"));
        assert!(problem(json!([1])).contains("params must be an object"));
        assert_eq!(
            malformed_request("tools/list", Some(&json!({"cursor": 5}))).code,
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            malformed_request("shell/exec", None).code,
            ErrorCode::METHOD_NOT_FOUND
        );
    }
}
