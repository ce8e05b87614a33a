//! The tools offered to sandboxed code: the operator's (`[[tools.http]]`, the tools of
//! each `[[tools.mcp]]` server, listed at start-up) plus, per request, the caller's own.
//! Each tool carries its compiled JSON Schema and the API keys that may see it.

use std::sync::Arc;

use serde_json::Value;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::{self, ToolSpec};

use super::ProviderKind;
use super::caller::CallerBridge;
use super::http::HttpTool;
use super::tls::TrustRoots;
use super::upstream::Upstream;
use crate::config::ToolsConfig;

/// The most schema violations one error lists.
const MAX_REPORTED_VIOLATIONS: usize = 5;

/// Who answers a tool's calls.
#[derive(Clone)]
pub enum Provider {
    Http(Arc<HttpTool>),
    Mcp(Arc<Upstream>),
    Caller(Arc<CallerBridge>),
}

impl Provider {
    pub fn kind(&self) -> ProviderKind {
        match self {
            Provider::Http(_) => ProviderKind::Http,
            Provider::Mcp(_) => ProviderKind::Mcp,
            Provider::Caller(_) => ProviderKind::Caller,
        }
    }

    /// Carries out one call (already checked) of the tool the provider knows as `name`.
    pub async fn call(&self, name: &str, arguments: Value, max_result_bytes: usize) -> ToolOutcome {
        match self {
            Provider::Http(tool) => tool.call(arguments, max_result_bytes).await,
            Provider::Mcp(server) => server.call(name, arguments, max_result_bytes).await,
            Provider::Caller(bridge) => bridge.call(name, arguments).await,
        }
    }
}

/// One tool of the catalog.
pub struct CatalogTool {
    /// What user code and models see.
    pub spec: ToolSpec,
    /// The name its provider knows it by (an MCP server's own tool name).
    pub upstream_name: String,
    pub provider: Provider,
    /// API key names that see it; `None`: every caller.
    pub tenants: Option<Vec<String>>,
    validator: Option<jsonschema::Validator>,
}

/// Why a tool's schema was refused.
#[derive(Debug, thiserror::Error)]
#[error("tool '{name}': its parameters are not a usable JSON Schema: {reason}")]
pub struct SchemaError {
    pub name: String,
    pub reason: String,
}

impl CatalogTool {
    pub fn new(
        spec: ToolSpec,
        upstream_name: String,
        provider: Provider,
        tenants: Option<Vec<String>>,
    ) -> Result<Self, SchemaError> {
        let validator = jsonschema::validator_for(&spec.parameters).map_err(|e| SchemaError {
            name: spec.name.clone(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            spec,
            upstream_name,
            provider,
            tenants,
            validator: Some(validator),
        })
    }

    /// Checks arguments against the schema; the error lists the first violations.
    pub fn check(&self, arguments: &Value) -> Result<(), String> {
        if !arguments.is_object() {
            return Err("the arguments must be a JSON object (keyword arguments)".into());
        }
        let Some(validator) = &self.validator else {
            return Ok(());
        };
        let problems: Vec<String> = validator
            .iter_errors(arguments)
            .take(MAX_REPORTED_VIOLATIONS)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = at.trim_start_matches('/').replace('/', ".");
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("{at}: {e}")
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// The metrics label: the tool's name for the operator's tools (a configured, closed
    /// set), `caller` for tools a request declared (names chosen by callers).
    pub fn metric_label(&self) -> String {
        match self.provider {
            Provider::Caller(_) => ProviderKind::Caller.as_str().to_owned(),
            _ => self.spec.name.clone(),
        }
    }

    fn visible_to(&self, owner: Option<&str>) -> bool {
        match (&self.tenants, owner) {
            (None, _) => true,
            // Without API keys there are no tenants to tell apart: local use sees all.
            (Some(_), None) => true,
            (Some(names), Some(owner)) => names.iter().any(|n| n == owner),
        }
    }
}

/// The operator's tools, fixed at start-up.
#[derive(Default)]
pub struct Catalog {
    tools: Vec<Arc<CatalogTool>>,
}

/// Why the catalog could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error("tools.http '{name}': {reason}")]
    Http { name: String, reason: String },
    #[error("tools.mcp '{name}': {reason}")]
    Mcp { name: String, reason: String },
    #[error("tool name '{0}' is offered twice (an HTTP tool and an MCP tool, or two MCP tools)")]
    Duplicate(String),
}

impl Catalog {
    /// Builds the catalog: HTTP tools from the configuration, then each MCP server's
    /// tools (connecting to it and listing them), trusting `roots` for HTTPS
    /// ([`TrustRoots::load`] of `tools.ca_file`, read before anything else starts).
    pub async fn start(config: &ToolsConfig, roots: TrustRoots) -> Result<Self, CatalogError> {
        let mut tools = Vec::new();
        for http in &config.http {
            let tool = HttpTool::new(http, &roots).map_err(|reason| CatalogError::Http {
                name: http.name.clone(),
                reason,
            })?;
            let spec = ToolSpec {
                name: http.name.clone(),
                description: http.description.clone(),
                parameters: http.parameters.clone(),
            };
            tools.push(Arc::new(CatalogTool::new(
                spec,
                http.name.clone(),
                Provider::Http(Arc::new(tool)),
                http.tenants.clone(),
            )?));
        }
        for server in &config.mcp {
            let fail = |reason: String| CatalogError::Mcp {
                name: server.name.clone(),
                reason,
            };
            let (upstream, listed) = Upstream::connect(server, &roots, config.max_result_bytes)
                .await
                .map_err(fail)?;
            let upstream = Arc::new(upstream);
            for (name, spec) in listed {
                tools.push(Arc::new(CatalogTool::new(
                    spec,
                    name,
                    Provider::Mcp(upstream.clone()),
                    server.tenants.clone(),
                )?));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for tool in &tools {
            if !seen.insert(tool.spec.name.clone()) {
                return Err(CatalogError::Duplicate(tool.spec.name.clone()));
            }
        }
        Ok(Self { tools })
    }

    /// The tools `owner` (an API key's tenant; `None` without keys) may call.
    pub fn visible_to(&self, owner: Option<&str>) -> Vec<Arc<CatalogTool>> {
        self.tools
            .iter()
            .filter(|t| t.visible_to(owner))
            .cloned()
            .collect()
    }

    /// `(name, description)` of the tools `owner` may call: what its tool descriptions
    /// name.
    pub fn described_to(&self, owner: Option<&str>) -> Vec<(String, String)> {
        self.tools
            .iter()
            .filter(|t| t.visible_to(owner))
            .map(|t| (t.spec.name.clone(), t.spec.description.clone()))
            .collect()
    }

    /// Every configured tool name (the metrics' label set for `tool`).
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.spec.name.clone()).collect()
    }

    /// `owner`'s tools matching `query`, best first.
    pub fn search(&self, owner: Option<&str>, query: &str, limit: usize) -> Vec<ToolSpec> {
        let specs: Vec<ToolSpec> = self
            .visible_to(owner)
            .iter()
            .map(|t| t.spec.clone())
            .collect();
        toolspec::search(&specs, query, limit)
            .into_iter()
            .map(|i| specs[i].clone())
            .collect()
    }
}

/// A tool error with the provider's message and data.
pub fn failed(message: impl Into<String>, data: Value) -> ToolOutcome {
    ToolOutcome::Error {
        kind: ToolErrorKind::Failed,
        message: message.into(),
        data,
    }
}
