//! Tool call metrics (Code Mode). The `tool` label is bounded by the configuration: an
//! operator tool's name, `caller` for every tool a request declared (callers choose
//! those names), `unknown` for a name no catalog offers.

use std::time::Duration;

use super::Metrics;

/// The `tool` of calls whose name no catalog offers.
pub const UNKNOWN_TOOL: &str = "unknown";

/// The `provider` of calls whose name no tool of the run has (refused unsent; a call of a
/// known tool refused by a limit or its schema is labelled with the tool's provider).
pub const NO_PROVIDER: &str = "none";

/// Tool calls take from microseconds (a refused call) to the call timeout.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.005, 0.025, 0.1, 0.5, 2.0, 10.0, 60.0,
];

impl Metrics {
    /// The closed part: the duration by provider, and calls of caller-declared tools by
    /// outcome, at 0.
    pub(super) fn prefill_tools(&self) {
        use crate::codemode::ProviderKind;
        use snakecage_worker::protocol::ToolErrorKind;
        for provider in ProviderKind::ALL {
            self.tool_call_duration
                .with_label_values(&[provider.as_str()]);
        }
        let caller = ProviderKind::Caller.as_str();
        self.tool_calls.with_label_values(&[caller, caller, "ok"]);
        for kind in ToolErrorKind::ALL {
            self.tool_calls
                .with_label_values(&[caller, caller, kind.as_str()]);
        }
    }

    /// The operator's tool names: the only values `tool` takes besides `caller` and
    /// `unknown`. Set once at start-up.
    pub fn set_tool_names(&self, names: impl IntoIterator<Item = String>) {
        let _ = self.tool_names.set(names.into_iter().collect());
    }

    /// One finished call.
    pub fn tool_call(&self, tool: &str, provider: &str, outcome: &str, took: Duration) {
        let known = tool == "caller"
            || self
                .tool_names
                .get()
                .is_some_and(|names| names.contains(tool));
        let tool = if known { tool } else { UNKNOWN_TOOL };
        self.tool_calls
            .with_label_values(&[tool, provider, outcome])
            .inc();
        self.tool_call_duration
            .with_label_values(&[provider])
            .observe(took.as_secs_f64());
    }

    /// Tool calls counted so far (the status page).
    pub fn tool_calls_total(&self) -> u64 {
        use prometheus::core::Collector;
        self.tool_calls
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}
