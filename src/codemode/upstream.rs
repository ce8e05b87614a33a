//! `[[tools.mcp]]`: an upstream MCP server (streamable HTTP, or a stdio command the
//! operator names) as an rmcp client. Its tools are listed once at start-up into the
//! catalog as `<server>_<tool>`, and each call is forwarded as `tools/call`. A result's
//! structured content is the Python value; otherwise its text (parsed as JSON when it is
//! JSON). `isError` results raise `ToolError` with the text as message.

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::Value;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::{ToolSpec, valid_name};

use super::catalog::failed;
use crate::config::McpServerConfig;

pub struct Upstream {
    name: String,
    client: RunningService<RoleClient, ()>,
}

impl Upstream {
    /// Connects, initialises and lists the server's tools: `(its name, the spec offered)`.
    pub async fn connect(
        config: &McpServerConfig,
    ) -> Result<(Self, Vec<(String, ToolSpec)>), String> {
        let client = match (&config.url, &config.command) {
            (Some(url), _) => {
                ().serve(StreamableHttpClientTransport::from_uri(url.as_str()))
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
