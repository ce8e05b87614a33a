//! Code Mode: sandboxed Python calls host tools (`from snakecage import tools`).
//!
//! - [`catalog`]: the operator's tools (HTTP and upstream MCP), scoped per API key.
//! - [`http`]: `[[tools.http]]`, one request per call.
//! - [`upstream`]: `[[tools.mcp]]`, upstream MCP servers as a client.
//! - [`caller`]: tools a request declares, answered by its client over SSE.
//! - [`tls`]: the CA certificates HTTPS tools and MCP servers are checked against.
//!
//! A run's [`Toolbox`] answers its worker's calls: it checks each one again (the worker is
//! hostile: name, argument size, JSON Schema), enforces the per-run limits, dispatches
//! to the tool's provider under the per-call timeout, caps the result and records it.

pub mod caller;
pub mod catalog;
pub mod http;
pub mod tls;
pub mod upstream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use snakecage_worker::jsondepth::{self, MAX_TOOL_JSON_DEPTH};
use snakecage_worker::protocol::{ToolCall, ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::ToolSpec;

use crate::config::ToolsConfig;
use crate::metrics::Metrics;
use crate::pool::cancel_cause::{CancelCause, cancelling};
use crate::pool::toolcalls::{ToolFuture, ToolHost};

pub use self::catalog::{Catalog, CatalogTool, Provider};

/// The per-run limits on tool calls (from `[tools]`).
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    pub max_calls: u32,
    pub call_timeout: Duration,
    pub max_argument_bytes: usize,
    pub max_result_bytes: usize,
}

impl CallLimits {
    pub fn from_config(config: &ToolsConfig) -> Self {
        Self {
            max_calls: config.max_calls_per_run,
            call_timeout: Duration::from_millis(config.call_timeout_ms),
            max_argument_bytes: config.max_argument_bytes,
            max_result_bytes: config.max_result_bytes,
        }
    }
}

/// Where a call goes, as the metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Caller,
    Http,
    Mcp,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 3] =
        [ProviderKind::Caller, ProviderKind::Http, ProviderKind::Mcp];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Caller => "caller",
            ProviderKind::Http => "http",
            ProviderKind::Mcp => "mcp",
        }
    }
}

/// The tools of one run and the state of its calls.
pub struct Toolbox {
    tools: Vec<Arc<CatalogTool>>,
    limits: CallLimits,
    calls: AtomicU32,
    metrics: Arc<Metrics>,
}

impl Toolbox {
    pub fn new(tools: Vec<Arc<CatalogTool>>, limits: CallLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            tools,
            limits,
            calls: AtomicU32::new(0),
            metrics,
        }
    }

    /// What the worker is told about the tools (`snakecage.tools.list()`).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Checks `call` of `tool` (`None`: no tool of the run has its name) before it is
    /// dispatched: the per-run count, the name, the size and the schema of the arguments.
    fn admit(
        &self,
        call: &ToolCall,
        tool: Option<&Arc<CatalogTool>>,
    ) -> Result<Arc<CatalogTool>, ToolOutcome> {
        let made = self.calls.fetch_add(1, Ordering::Relaxed);
        if made >= self.limits.max_calls {
            return Err(ToolOutcome::error(
                ToolErrorKind::Limit,
                format!(
                    "this run has made its {} tool calls (tools.max_calls_per_run); do more work per call",
                    self.limits.max_calls
                ),
            ));
        }
        let Some(tool) = tool else {
            return Err(ToolOutcome::error(
                ToolErrorKind::UnknownTool,
                format!("unknown tool '{}'", call.name),
            ));
        };
        let size = serde_json::to_vec(&call.arguments).map_or(usize::MAX, |v| v.len());
        if size > self.limits.max_argument_bytes {
            return Err(ToolOutcome::error(
                ToolErrorKind::Limit,
                format!(
                    "the arguments of '{}' are {size} bytes of JSON, more than the {} allowed (tools.max_argument_bytes)",
                    call.name, self.limits.max_argument_bytes
                ),
            ));
        }
        if let Err(problems) = tool.check(&call.arguments) {
            return Err(ToolOutcome::error(
                ToolErrorKind::InvalidArguments,
                format!(
                    "arguments of tool '{}' do not match its schema: {problems}",
                    call.name
                ),
            ));
        }
        Ok(tool.clone())
    }
}

impl ToolHost for Toolbox {
    fn call(&self, call: ToolCall) -> ToolFuture {
        let found = self.tools.iter().find(|t| t.spec.name == call.name);
        let record = CallRecord::new(self.metrics.clone(), found.map(|t| &**t));
        let tool = match self.admit(&call, found) {
            Ok(tool) => tool,
            Err(refused) => {
                record.finish(&refused);
                return Box::pin(async move { refused });
            }
        };
        let limits = self.limits;
        // The record moves into the future: dropped unfinished (the run ended, was
        // interrupted or cancelled, the program cancelled the call), it counts the call
        // `cancelled`, whether or not the future was ever polled.
        Box::pin(async move {
            let mut answer = Box::pin(tool.provider.call(
                &tool.upstream_name,
                call.arguments,
                limits.max_result_bytes,
            ));
            let answered = tokio::time::timeout(limits.call_timeout, &mut answer).await;
            let outcome = match answered {
                Ok(outcome) => cap_result(outcome, limits.max_result_bytes),
                Err(_) => {
                    // Dropped here, saying why: a caller tool's client is told.
                    cancelling(CancelCause::CallTimeout, || drop(answer));
                    ToolOutcome::error(
                        ToolErrorKind::Timeout,
                        format!(
                            "tool '{}' did not answer within {} ms (tools.call_timeout_ms)",
                            tool.spec.name,
                            limits.call_timeout.as_millis()
                        ),
                    )
                }
            };
            record.finish(&outcome);
            outcome
        })
    }
}

/// A result bigger than the limit, or nested deeper than [`MAX_TOOL_JSON_DEPTH`] (which no
/// worker could read past its frame codec's depth), becomes a `limit` error; error `data`
/// past either is dropped, the error kept. Every provider's answer passes here.
fn cap_result(outcome: ToolOutcome, max: usize) -> ToolOutcome {
    match outcome {
        ToolOutcome::Ok { result } => match over_limits(&result, max) {
            None => ToolOutcome::Ok { result },
            Some(Over::Size) => ToolOutcome::error(
                ToolErrorKind::Limit,
                format!(
                    "the tool's result is larger than the {max} bytes allowed (tools.max_result_bytes)"
                ),
            ),
            Some(Over::Depth(depth)) => ToolOutcome::error(
                ToolErrorKind::Limit,
                jsondepth::too_deep("the tool's result", depth),
            ),
        },
        ToolOutcome::Error {
            kind,
            mut message,
            data,
        } => {
            let data = match over_limits(&data, max) {
                None => data,
                Some(Over::Size) => Value::Null,
                Some(Over::Depth(depth)) => {
                    message.push_str(&format!(
                        " (its data was dropped: {})",
                        jsondepth::too_deep("it", depth)
                    ));
                    Value::Null
                }
            };
            ToolOutcome::Error {
                kind,
                message,
                data,
            }
        }
    }
}

/// How a value breaks the limits on a result, depth first.
enum Over {
    Size,
    Depth(usize),
}

fn over_limits(value: &Value, max: usize) -> Option<Over> {
    let depth = jsondepth::value_depth(value);
    if depth > MAX_TOOL_JSON_DEPTH {
        return Some(Over::Depth(depth));
    }
    let size = serde_json::to_vec(value).map_or(usize::MAX, |b| b.len());
    (size > max).then_some(Over::Size)
}

/// One call as the metrics count it, exactly once: with its outcome when it is answered
/// ([`CallRecord::finish`]), or `cancelled` when it is dropped unanswered.
struct CallRecord {
    metrics: Arc<Metrics>,
    /// `tool` and `provider` labels (see [`crate::metrics::tools`]).
    tool: String,
    provider: &'static str,
    started: Instant,
    finished: bool,
}

impl CallRecord {
    /// The record of a call of `tool`; `None`: a name no tool of the run has (`unknown`,
    /// provider `none`).
    fn new(metrics: Arc<Metrics>, tool: Option<&CatalogTool>) -> Self {
        Self {
            metrics,
            tool: tool.map_or_else(
                || crate::metrics::tools::UNKNOWN_TOOL.to_owned(),
                CatalogTool::metric_label,
            ),
            provider: tool.map_or(crate::metrics::tools::NO_PROVIDER, |t| {
                t.provider.kind().as_str()
            }),
            started: Instant::now(),
            finished: false,
        }
    }

    fn finish(mut self, outcome: &ToolOutcome) {
        let label = match outcome {
            ToolOutcome::Ok { .. } => "ok",
            ToolOutcome::Error { kind, .. } => kind.as_str(),
        };
        self.count(label);
        self.finished = true;
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .tool_call(&self.tool, self.provider, outcome, self.started.elapsed());
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        if !self.finished {
            self.count(ToolErrorKind::Cancelled.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::catalog::failed;
    use super::*;
    use serde_json::json;

    #[test]
    fn oversized_results_become_limit_errors() {
        let big = ToolOutcome::Ok {
            result: json!("x".repeat(100)),
        };
        assert!(matches!(
            cap_result(big, 50),
            ToolOutcome::Error {
                kind: ToolErrorKind::Limit,
                ..
            }
        ));
        let small = ToolOutcome::Ok { result: json!(1) };
        assert_eq!(cap_result(small.clone(), 50), small);
    }

    fn nested(levels: usize) -> Value {
        (0..levels).fold(json!(0), |inner, _| json!([inner]))
    }

    /// Results up to the depth limit pass; deeper ones are `limit` errors saying how deep,
    /// and error data nested too deep is dropped with a word why.
    #[test]
    fn results_nested_past_the_depth_limit_become_limit_errors() {
        let deepest = ToolOutcome::Ok {
            result: nested(MAX_TOOL_JSON_DEPTH),
        };
        assert_eq!(cap_result(deepest.clone(), 1 << 20), deepest);
        let ToolOutcome::Error { kind, message, .. } = cap_result(
            ToolOutcome::Ok {
                result: json!({"a": nested(MAX_TOOL_JSON_DEPTH)}),
            },
            1 << 20,
        ) else {
            panic!("a result too deep went through")
        };
        assert_eq!(kind, ToolErrorKind::Limit);
        assert!(
            message.starts_with("the tool's result is nested 65 levels deep, deeper than the 64"),
            "{message}"
        );
        let ToolOutcome::Error {
            kind,
            message,
            data,
        } = cap_result(failed("no such order", nested(100)), 1 << 20)
        else {
            panic!("not an error")
        };
        assert_eq!((kind, data), (ToolErrorKind::Failed, Value::Null));
        assert!(
            message.starts_with("no such order (its data was dropped: it is nested 100 levels"),
            "{message}"
        );
    }
}
