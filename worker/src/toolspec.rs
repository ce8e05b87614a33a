//! A host tool as user code sees it (name, description, JSON Schema of the parameters) and
//! the one search over a list of them, shared by `snakecage.tools.search()` in the worker
//! and `GET /v1/tools/catalog?query=` in the supervisor, so both rank alike.

use serde::{Deserialize, Serialize};

/// One tool offered to a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the keyword arguments (an object schema).
    #[serde(default = "empty_object_schema")]
    pub parameters: serde_json::Value,
}

/// The schema of a tool that takes no arguments.
pub fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// Whether `name` is a usable tool name: 1–64 ASCII letters, digits, `_`, `-` or `.`
/// (what OpenAI and Anthropic accept, plus dots for namespaced MCP tools).
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The indices of `tools` that match `query`, best first, at most `limit`. Every word of
/// the query (case-insensitive) scores where it occurs: 4 for the whole name, 3 in the
/// name, 1 in the description or the parameter names. An empty query lists every tool in
/// order; a query that matches nothing returns nothing.
pub fn search(tools: &[ToolSpec], query: &str, limit: usize) -> Vec<usize> {
    let words: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    if words.is_empty() {
        return (0..tools.len()).take(limit).collect();
    }
    let mut scored: Vec<(usize, usize)> = tools
        .iter()
        .enumerate()
        .filter_map(|(i, tool)| {
            let name = tool.name.to_lowercase();
            let description = tool.description.to_lowercase();
            let params = tool.parameters["properties"]
                .as_object()
                .map(|p| {
                    p.keys()
                        .map(|k| k.to_lowercase())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            let score: usize = words
                .iter()
                .map(|w| {
                    let in_name = if name == *w {
                        4
                    } else if name.contains(w.as_str()) {
                        3
                    } else {
                        0
                    };
                    in_name
                        + usize::from(description.contains(w.as_str()))
                        + usize::from(params.contains(w.as_str()))
                })
                .sum();
            (score > 0).then_some((i, score))
        })
        .collect();
    // Stable: equal scores keep the catalog's order.
    scored.sort_by_key(|&(_, score)| std::cmp::Reverse(score));
    scored.into_iter().take(limit).map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, description: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }
    }

    #[test]
    fn search_ranks_names_over_descriptions_and_keeps_order_on_ties() {
        let tools = [
            tool("get_forecast", "Weather forecast for a city"),
            tool("weather", "Current conditions"),
            tool("stock_price", "Price of a stock, by ticker"),
            tool("weather_alerts", "Alerts"),
        ];
        assert_eq!(search(&tools, "weather", 10), [1, 3, 0]);
        assert_eq!(search(&tools, "WEATHER forecast", 2), [0, 1]);
        assert_eq!(search(&tools, "city", 10), [0, 1, 2, 3]);
        assert!(search(&tools, "crypto", 10).is_empty());
        assert_eq!(search(&tools, "  ", 2), [0, 1]);
        assert_eq!(search(&tools, "prix über", 10), Vec::<usize>::new());
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("get_weather"));
        assert!(valid_name("github.search-issues"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("wetter_für"));
        assert!(!valid_name(&"x".repeat(65)));
    }
}
