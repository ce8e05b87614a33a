//! The MCP server at `/mcp` (Model Context Protocol over streamable HTTP, with `rmcp`).
//!
//! Its tools are [`crate::tools`]'s catalog, and each call is carried out by sending the
//! HTTP request the call maps to through the API router: the same validation, limits and
//! errors as for direct API clients. Failures of the user's code are tool results with
//! `isError: true` and the traceback; only malformed calls are protocol errors.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::Value;
use tower::ServiceExt;

use crate::tools::{self, ToolCallError, ToolContext};

/// Largest API answer a tool call reads (a run's response with its rich outputs).
const MAX_TOOL_RESPONSE: usize = 64 << 20;

/// The tool descriptions' context of the generation serving now (read at each listing, so
/// a rollover shows at once).
pub type LiveContext = Arc<dyn Fn() -> Arc<ToolContext> + Send + Sync>;

/// One MCP connection's handler; cheap to clone.
#[derive(Clone)]
pub struct McpServer {
    api: Router,
    context: LiveContext,
}

impl McpServer {
    pub fn new(api: Router, context: LiveContext) -> Self {
        Self { api, context }
    }

    /// Sends the request a tool call maps to through the API; returns status and JSON body.
    /// `authorization` is the MCP request's own header, so the call is made as its caller.
    async fn call_api(
        &self,
        name: &str,
        arguments: &Value,
        authorization: Option<&HeaderValue>,
    ) -> Result<(StatusCode, Value), McpError> {
        let call = tools::request(name, arguments).map_err(|e| match e {
            ToolCallError::UnknownTool(_) | ToolCallError::BadArguments { .. } => {
                McpError::invalid_params(e.to_string(), None)
            }
        })?;
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
        let request = builder
            .body(body)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let response = self
            .api
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), MAX_TOOL_RESPONSE)
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
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
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = tools::catalog(&(self.context)())
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
        let authorization = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get(header::AUTHORIZATION));
        let (status, body) = self
            .call_api(&request.name, &arguments, authorization)
            .await?;
        Ok(tool_result(&request.name, status, &body).into())
    }
}

/// Turns an API answer into what the model sees.
fn tool_result(tool: &str, status: StatusCode, body: &Value) -> CallToolResult {
    if !status.is_success() {
        let detail = body["detail"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_owned);
        let code = body["code"].as_str().unwrap_or("unknown");
        return CallToolResult::error(vec![ContentBlock::text(format!(
            "{tool} failed ({status}, code {code}): {detail}"
        ))]);
    }
    match tool {
        "run_python" | "run_in_session" => run_result(body),
        "close_python_session" => {
            CallToolResult::success(vec![ContentBlock::text("session closed")])
        }
        _ => CallToolResult::success(vec![ContentBlock::text(pretty(body))]),
    }
}

/// A run: a text summary (exit code, stdout, stderr, files), then each image output.
/// A run that did not end with exit code 0 is an error result, with its traceback.
fn run_result(body: &Value) -> CallToolResult {
    let mut text = format!(
        "exit_code: {}\nverdict: {}\n",
        body["exit_code"]
            .as_i64()
            .map_or_else(|| "null".into(), |c| c.to_string()),
        body["verdict"].as_str().unwrap_or("unknown"),
    );
    if body["timed_out"] == true {
        text.push_str("timed_out: true\n");
    }
    if let Some(notice) = body["notice"].as_str() {
        text.push_str(&format!("notice: {notice}\n"));
    }
    if let Some(session) = body["session"].as_object() {
        let names: Vec<&str> = session["names"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        text.push_str(&format!(
            "session: {} variables ({}), expires at {}\n",
            session["variables"],
            names.join(", "),
            session["expires_at"].as_str().unwrap_or("?")
        ));
    }
    for stream in ["stdout", "stderr"] {
        let out = body[stream].as_str().unwrap_or_default();
        if !out.is_empty() {
            text.push_str(&format!("--- {stream} ---\n{out}"));
            if !out.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    if let Some(files) = body["files"].as_array().filter(|f| !f.is_empty()) {
        text.push_str("--- files ---\n");
        for f in files {
            text.push_str(&format!(
                "{} ({}) file_id={}\n",
                f["path"].as_str().unwrap_or("?"),
                f["kind"].as_str().unwrap_or("?"),
                f["file_id"]
            ));
        }
    }
    let mut content = vec![ContentBlock::text(text)];
    for bundle in body["results"].as_array().into_iter().flatten() {
        if let Some(png) = bundle["image/png"].as_str() {
            content.push(ContentBlock::image(png, "image/png"));
        } else if let Some(plain) = bundle["text/plain"].as_str() {
            content.push(ContentBlock::text(plain));
        }
    }
    if body["exit_code"] == 0 {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// Middleware on `/mcp`: a session closed with `DELETE` is answered 200, not rmcp's 202.
/// The specification leaves the success status open; the MCP SDKs' own servers answer 200
/// and their clients accept only 200 or 204 (the official Python client logs "Session
/// termination failed: 202" otherwise). 202 means "accepted for later processing", but the
/// session is already closed when rmcp answers.
pub async fn session_closed_ok(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let closing = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    if closing && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// The tower service mounted at `/mcp`.
pub fn service(
    api: Router,
    context: LiveContext,
    allowed_hosts: Vec<String>,
    shutdown: tokio_util::sync::CancellationToken,
) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let server = McpServer::new(api, context);
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_cancellation_token(shutdown);
    StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        config,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failed_run_is_an_error_result_with_its_traceback() {
        let body = json!({"exit_code": 1, "verdict": "error", "stdout": "", "stderr": "Traceback ...\nZeroDivisionError: division by zero\n", "results": []});
        let r = run_result(&body);
        assert_eq!(r.is_error, Some(true));
        let text = serde_json::to_string(&r.content).unwrap();
        assert!(text.contains("ZeroDivisionError"), "{text}");
    }

    #[test]
    fn a_session_run_shows_its_state_and_any_notice() {
        let body = json!({"exit_code": 0, "verdict": "ok", "stdout": "", "stderr": "", "results": [],
            "replayed": 2, "notice": "a new worker replayed 2 runs",
            "session": {"variables": 2, "names": ["x", "df"], "expires_at": "2026-01-01T00:00:00Z"}});
        let text = serde_json::to_string(&run_result(&body).content).unwrap();
        assert!(
            text.contains("notice: a new worker replayed 2 runs"),
            "{text}"
        );
        assert!(text.contains("session: 2 variables (x, df)"), "{text}");
    }

    #[test]
    fn png_outputs_become_image_content() {
        let body = json!({"exit_code": 0, "verdict": "ok", "stdout": "hi\n", "stderr": "", "results": [{"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}]});
        let r = run_result(&body);
        assert_eq!(r.is_error, Some(false));
        let json = serde_json::to_value(&r.content).unwrap();
        assert_eq!(json[1]["type"], "image");
        assert_eq!(json[1]["mimeType"], "image/png");
    }

    #[test]
    fn an_api_refusal_is_an_error_result_that_quotes_the_detail() {
        let r = tool_result(
            "run_in_session",
            StatusCode::GONE,
            &json!({"detail": "session s was lost"}),
        );
        assert_eq!(r.is_error, Some(true));
        assert!(
            serde_json::to_string(&r.content)
                .unwrap()
                .contains("session s was lost")
        );
    }
}
