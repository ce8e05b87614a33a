//! `[[tools.mcp]]`: an upstream MCP server (streamable HTTP, or a stdio command the
//! operator names) as an rmcp client. Its tools are listed once at start-up into the
//! catalog as `<server>_<tool>`, and each call is forwarded as `tools/call`. A result's
//! structured content is the Python value; otherwise its text (parsed as JSON when it is
//! JSON). `isError` results raise `ToolError` with the text as message.

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::Value;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::{ToolSpec, valid_name};

use super::catalog::failed;
use super::tls::TrustRoots;
use crate::config::McpServerConfig;

pub struct Upstream {
    name: String,
    client: RunningService<RoleClient, ()>,
}

impl Upstream {
    /// Connects, initialises and lists the server's tools: `(its name, the spec offered)`.
    pub async fn connect(
        config: &McpServerConfig,
        roots: &TrustRoots,
    ) -> Result<(Self, Vec<(String, ToolSpec)>), String> {
        let client = match (&config.url, &config.command) {
            (Some(url), _) => {
                let transport = StreamableHttpClientTransport::with_client(
                    http_client(roots)?,
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()),
                );
                ().serve(transport)
                    .await
                    .map_err(|e| format!("connecting to {url}: {e}"))?
            }
            (None, Some(argv)) if !argv.is_empty() => {
                let mut command = tokio::process::Command::new(&argv[0]);
                command.args(&argv[1..]).env_clear().envs(&config.env);
                let transport = TokioChildProcess::new(command)
                    .map_err(|e| format!("starting {:?}: {e}", argv[0]))?;
                ().serve(transport)
                    .await
                    .map_err(|e| format!("initialising {:?}: {e}", argv[0]))?
            }
            _ => return Err("give exactly one of url and command".into()),
        };
        let listed = client
            .list_all_tools()
            .await
            .map_err(|e| format!("listing its tools: {e}"))?;
        let mut tools = Vec::with_capacity(listed.len());
        for tool in listed {
            let offered = format!("{}_{}", config.name, tool.name);
            if !valid_name(&offered) {
                tracing::warn!(server = %config.name, tool = %tool.name, "an upstream MCP tool's name is not usable; skipped");
                continue;
            }
            tools.push((
                tool.name.to_string(),
                ToolSpec {
                    name: offered,
                    description: tool.description.as_deref().unwrap_or_default().to_owned(),
                    parameters: Value::Object((*tool.input_schema).clone()),
                },
            ));
        }
        tracing::info!(server = %config.name, tools = tools.len(), "upstream MCP server connected");
        Ok((
            Self {
                name: config.name.clone(),
                client,
            },
            tools,
        ))
    }

    pub async fn call(&self, tool: &str, arguments: Value) -> ToolOutcome {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        let result = match self.client.call_tool(params).await {
            Ok(result) => result,
            Err(e) => {
                return ToolOutcome::error(
                    ToolErrorKind::Unavailable,
                    format!("MCP server '{}': {e}", self.name),
                );
            }
        };
        let text: Vec<&str> = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
            .collect();
        let text = text.join("\n");
        if result.is_error == Some(true) {
            let data = result.structured_content.unwrap_or(Value::Null);
            return failed(text, data);
        }
        let value = match result.structured_content {
            Some(v) => v,
            None => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        };
        ToolOutcome::Ok { result: value }
    }
}

/// How many redirects one request to an upstream follows.
const MAX_REDIRECTS: usize = 10;

/// The client of a streamable HTTP upstream: what rmcp's default client is (no idle
/// connections kept; only same-origin 307 and 308 redirects, which keep the JSON-RPC body,
/// followed), trusting `roots`.
fn http_client(roots: &TrustRoots) -> Result<reqwest::Client, String> {
    let redirects = reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    roots
        .apply(reqwest::Client::builder())
        .pool_max_idle_per_host(0)
        .redirect(redirects)
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}
