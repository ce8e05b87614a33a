//! The tools snakecage offers a model: one catalog, rendered for OpenAI (`type: function`),
//! for Anthropic (`name` / `description` / `input_schema`) and for MCP, with descriptions
//! generated from the live configuration (limits, packages) so they never drift from what
//! the service actually does.
//!
//! Every tool call is carried out as the HTTP request it maps to ([`ToolSpec::request`]):
//! the MCP server and any agent framework run tools through the same routes, validation
//! and limits as direct API clients.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::Config;

/// The output formats of `GET /v1/tools`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ToolFormat {
    #[default]
    Openai,
    Anthropic,
}

/// What the descriptions say about the environment.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub python_version: String,
    /// Third-party packages user code may import, with versions where known.
    pub packages: Vec<(String, Option<String>)>,
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub memory_limit_mb: u64,
    pub max_output_bytes: usize,
    /// `limits.max_request_bytes`: the largest request a call may make (its code included).
    pub max_request_bytes: usize,
    pub max_session_ttl_seconds: u64,
    /// Host tools the code may call (Code Mode): `(name, description)`, the caller's own
    /// where it is known (`GET /v1/tools`), else those offered to every caller.
    pub code_tools: Vec<(String, String)>,
    /// `tools.max_calls_per_run`.
    pub max_tool_calls: u32,
    /// `tools.max_concurrent_calls`.
    pub max_concurrent_tool_calls: u32,
}

impl ToolContext {
    pub fn new(
        config: &Config,
        python_version: String,
        packages: Vec<(String, Option<String>)>,
    ) -> Self {
        Self {
            python_version,
            packages,
            default_timeout_ms: config.limits.default_timeout_ms,
            max_timeout_ms: config.limits.max_timeout_ms,
            memory_limit_mb: config.limits.memory_limit_mb,
            max_output_bytes: config.limits.max_output_bytes,
            max_request_bytes: config.limits.max_request_bytes,
            max_session_ttl_seconds: config.sessions.max_ttl_seconds,
            code_tools: Vec::new(),
            max_tool_calls: config.tools.max_calls_per_run,
            max_concurrent_tool_calls: config.tools.max_concurrent_calls,
        }
    }

    /// This context with `tools` as the host tools the descriptions name.
    pub fn with_code_tools(&self, tools: Vec<(String, String)>) -> Self {
        Self {
            code_tools: tools,
            ..self.clone()
        }
    }

    /// What the descriptions say about host tools (Code Mode), empty without any: search
    /// first, then one program that calls them in loops and prints only what matters.
    fn code_mode(&self) -> String {
        if self.code_tools.is_empty() {
            return String::new();
        }
        const LISTED: usize = 30;
        let listed: Vec<String> = self
            .code_tools
            .iter()
            .take(LISTED)
            .map(|(name, description)| {
                let short: String = description.chars().take(80).collect();
                format!("{name} ({short})")
            })
            .collect();
        let more = self.code_tools.len().saturating_sub(LISTED);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!(
            " Host tools are callable from the code: `from snakecage import tools`; \
             tools.search(\"what you need\") returns the best matches with their JSON Schema \
             parameters, tools.<name>(**kwargs) calls one and returns its JSON result, a failure \
             raises tools.ToolError (message, data); a tool whose name is not a Python \
             identifier (github.search-issues) or is one of the module's own (search, list, \
             call) is called as tools.call(\"<name>\", **kwargs). Offered: {}{more}. Prefer ONE program that \
             searches, calls the tools in loops, filters and aggregates, and prints only the \
             final answer, over one tool call per turn; a run may make up to {} tool calls. \
             Calls run concurrently: fan independent calls out with a ThreadPoolExecutor \
             (pool.map(lambda x: tools.<name>(arg=x), items)), or in asyncio code await \
             asyncio.gather(*(tools.aio.<name>(arg=x) for x in items)); up to {} are in flight \
             at once (more wait their turn), so the run takes as long as the slowest call, not \
             the sum.",
            listed.join(", "),
            self.max_tool_calls,
            self.max_concurrent_tool_calls
        )
    }

    fn environment(&self) -> String {
        let packages = if self.packages.is_empty() {
            "only the standard library".to_owned()
        } else {
            let names: Vec<String> = self
                .packages
                .iter()
                .map(|(name, version)| match version {
                    Some(v) => format!("{name} {v}"),
                    None => name.clone(),
                })
                .collect();
            format!(
                "the standard library (an allowlisted subset) and {}",
                names.join(", ")
            )
        };
        format!(
            "Python {py} in an isolated sandbox: no network access, no subprocesses, files only in \
             the working directory. Available: {packages}; call list_packages for the exact list. \
             Each call may run up to {timeout} ms by default (timeout_ms up to {max} ms) and \
             allocate up to {mem} MB; stdout and stderr are each kept to {out} bytes (the start and the end of a longer one). A call, its \
             code and other arguments together, may be up to {req} bytes: pass larger data as \
             stored files. What the code prints to stdout is what you see, so print the results you need; a bare last \
             expression is printed too, as in a notebook. matplotlib figures and DataFrames left \
             as the last expression come back as images and tables. asyncio works, and `await` \
             may be used at top level as in a notebook.{code_mode}",
            code_mode = self.code_mode(),
            py = self.python_version,
            timeout = self.default_timeout_ms,
            max = self.max_timeout_ms,
            mem = self.memory_limit_mb,
            out = self.max_output_bytes,
            req = self.max_request_bytes,
        )
    }
}

/// One tool: its name, its generated description, its JSON Schema.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: String,
    pub input_schema: Value,
}

/// An HTTP request a tool call turns into.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub method: axum::http::Method,
    pub path: String,
    pub body: Option<Value>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ToolCallError {
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    #[error("tool {tool}: {problem}")]
    BadArguments { tool: String, problem: String },
}

fn files_schema() -> Value {
    json!({
        "type": "array",
        "description": "Stored files (uploaded with POST /v1/files, or written by an earlier run) to place in the working directory before the code runs.",
        "items": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Relative path in the working directory, e.g. data/sales.csv."},
                "file_id": {"type": "string", "description": "The id of the stored file."}
            },
            "required": ["path", "file_id"],
            "additionalProperties": false
        }
    })
}

/// `code`: a string, or an array of lines (as some chat apps' native tool mode sends it).
fn code_schema(what: &str) -> Value {
    json!({
        "description": format!(
            "{what} Either one string, or an array of strings (one line each; they are joined with newlines)."
        ),
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}}
        ]
    })
}

fn timeout_schema(ctx: &ToolContext) -> Value {
    json!({
        "type": "integer",
        "minimum": 1,
        "maximum": ctx.max_timeout_ms,
        "description": format!("Wall-clock limit in milliseconds (default {}).", ctx.default_timeout_ms)
    })
}

/// The catalog, in a stable order.
pub fn catalog(ctx: &ToolContext) -> Vec<ToolSpec> {
    let env = ctx.environment();
    vec![
        ToolSpec {
            name: "run_python",
            description: format!(
                "Run Python code in a fresh process and return its stdout, stderr, exit code and any \
                 files it wrote (each with a file_id). Nothing persists between calls; use a Python \
                 session for that. {env}"
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "code": code_schema("The Python program to run."),
                    "files": files_schema(),
                    "timeout_ms": timeout_schema(ctx),
                },
                "required": ["code"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "list_packages",
            description: "List the Python version, the standard-library modules and the third-party packages (with versions) that code may import.".into(),
            input_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
        ToolSpec {
            name: "create_python_session",
            description: format!(
                "Start a Python session whose variables, imports and files persist across \
                 run_in_session calls, like a notebook. Returns its session_id. Close it with \
                 close_python_session when done; idle sessions expire. {env}"
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "files": files_schema(),
                    "ttl_seconds": {
                        "type": "integer", "minimum": 1, "maximum": ctx.max_session_ttl_seconds,
                        "description": "Idle time after which the session is deleted."
                    },
                    "replay": {
                        "type": "boolean",
                        "description": "Keep the successful runs and replay them on a new process if the session's process is lost (crash, kill), instead of losing the session. Runs are repeated with their side effects, but their tool calls are answered from the session's record, never made again; each response says when a replay happened."
                    }
                },
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "run_in_session",
            description: "Run Python code in an existing session: earlier variables and imports are still there. Returns stdout, stderr, exit code and new or changed files. A run over its time limit is interrupted (KeyboardInterrupt) and the session keeps its state.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "session_id": {"type": "string", "description": "From create_python_session."},
                    "code": code_schema("The Python code to run."),
                    "files": files_schema(),
                    "timeout_ms": timeout_schema(ctx),
                },
                "required": ["session_id", "code"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "close_python_session",
            description: "Close a Python session, freeing its process and deleting its working directory.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"session_id": {"type": "string", "description": "From create_python_session."}},
                "required": ["session_id"],
                "additionalProperties": false
            }),
        },
    ]
}

/// The catalog as `GET /v1/tools?format=...` returns it: an array ready to pass as a model
/// call's `tools`.
pub fn render(specs: &[ToolSpec], format: ToolFormat) -> Value {
    let tools = specs.iter().map(|t| match format {
        ToolFormat::Openai => json!({
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}
        }),
        ToolFormat::Anthropic => json!({
            "name": t.name, "description": t.description, "input_schema": t.input_schema
        }),
    });
    Value::Array(tools.collect())
}

/// Refuses arguments the tool's advertised schema does not name (its `additionalProperties`
/// is false), naming each one and those the tool takes. The values themselves are checked by
/// the API the call is carried out through, which says what is wrong with them.
pub fn check_arguments(spec: &ToolSpec, arguments: &Value) -> Result<(), ToolCallError> {
    let bad = |problem: String| ToolCallError::BadArguments {
        tool: spec.name.to_owned(),
        problem,
    };
    let object = arguments
        .as_object()
        .ok_or_else(|| bad("arguments must be a JSON object".into()))?;
    if spec.input_schema["additionalProperties"] != false {
        return Ok(());
    }
    let known = spec.input_schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let unknown: Vec<String> = object
        .keys()
        .filter(|k| !known.contains_key(*k))
        .map(|k| format!("`{k}`"))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let takes = if known.is_empty() {
        "it takes no arguments".to_owned()
    } else {
        let names: Vec<&str> = known.keys().map(String::as_str).collect();
        format!("it takes {}", names.join(", "))
    };
    Err(bad(format!(
        "unknown argument{} {}; {takes}",
        if unknown.len() == 1 { "" } else { "s" },
        unknown.join(", ")
    )))
}

/// The HTTP request that carries out a call of `tool` with `arguments`.
pub fn request(tool: &str, arguments: &Value) -> Result<ToolRequest, ToolCallError> {
    use axum::http::Method;
    let bad = |problem: &str| ToolCallError::BadArguments {
        tool: tool.to_owned(),
        problem: problem.to_owned(),
    };
    let object = arguments
        .as_object()
        .ok_or_else(|| bad("arguments must be a JSON object"))?;
    let session_id = || -> Result<String, ToolCallError> {
        let id = object
            .get("session_id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("session_id (a string) is required"))?;
        // Ids are opaque tokens; anything that could change the path is not one.
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad("session_id is not a valid session id"));
        }
        Ok(id.to_owned())
    };
    let without = |key: &str| {
        let mut body = object.clone();
        body.remove(key);
        Value::Object(body)
    };
    Ok(match tool {
        "run_python" => ToolRequest {
            method: Method::POST,
            path: "/v1/execute".into(),
            body: Some(arguments.clone()),
        },
        "list_packages" => ToolRequest {
            method: Method::GET,
            path: "/v1/packages".into(),
            body: None,
        },
        "create_python_session" => ToolRequest {
            method: Method::POST,
            path: "/v1/sessions".into(),
            body: Some(arguments.clone()),
        },
        "run_in_session" => ToolRequest {
            method: Method::POST,
            path: format!("/v1/sessions/{}/execute", session_id()?),
            body: Some(without("session_id")),
        },
        "close_python_session" => ToolRequest {
            method: Method::DELETE,
            path: format!("/v1/sessions/{}", session_id()?),
            body: None,
        },
        other => return Err(ToolCallError::UnknownTool(other.to_owned())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ToolContext {
        ToolContext::new(
            &Config::default(),
            "3.12.1".into(),
            vec![
                ("numpy".into(), Some("2.4.6".into())),
                ("pandas".into(), None),
            ],
        )
    }

    #[test]
    fn descriptions_state_the_live_limits_and_packages() {
        let mut config = Config::default();
        config.limits.memory_limit_mb = 123;
        config.limits.max_timeout_ms = 4567;
        config.limits.max_request_bytes = 7654321;
        let ctx = ToolContext::new(
            &config,
            "3.12.1".into(),
            vec![("numpy".into(), Some("2.4.6".into()))],
        );
        let run = catalog(&ctx)
            .into_iter()
            .find(|t| t.name == "run_python")
            .unwrap();
        for needle in [
            "123 MB",
            "4567 ms",
            "up to 7654321 bytes",
            "numpy 2.4.6",
            "no network",
            "Python 3.12.1",
            "stdout",
            "`await` may be used at top level",
        ] {
            assert!(
                run.description.contains(needle),
                "{needle:?} missing from {:?}",
                run.description
            );
        }
        assert_eq!(
            run.input_schema["properties"]["timeout_ms"]["maximum"],
            4567
        );
    }

    #[test]
    fn descriptions_name_the_host_tools_and_say_to_search_then_write_one_program() {
        assert!(!environment_of(&ctx()).contains("snakecage import tools"));
        let with = ctx().with_code_tools(vec![(
            "get_weather".into(),
            "Current weather for a city".into(),
        )]);
        let text = environment_of(&with);
        for needle in [
            "from snakecage import tools",
            "tools.search(",
            "get_weather (Current weather for a city)",
            "ONE program",
            "up to 1000 tool calls",
            "fan independent calls out with a ThreadPoolExecutor",
            "tools.aio.<name>(arg=x)",
            "up to 8 are in flight at once",
            "is called as tools.call(\"<name>\", **kwargs)",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text:?}");
        }
    }

    fn environment_of(ctx: &ToolContext) -> String {
        catalog(ctx)
            .into_iter()
            .find(|t| t.name == "run_python")
            .unwrap()
            .description
    }

    #[test]
    fn both_formats_carry_every_tool_with_its_schema() {
        let specs = catalog(&ctx());
        let openai = render(&specs, ToolFormat::Openai);
        let anthropic = render(&specs, ToolFormat::Anthropic);
        let names: Vec<&str> = specs.iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [
                "run_python",
                "list_packages",
                "create_python_session",
                "run_in_session",
                "close_python_session"
            ]
        );
        for (i, spec) in specs.iter().enumerate() {
            assert_eq!(openai[i]["type"], "function");
            assert_eq!(openai[i]["function"]["name"], spec.name);
            assert_eq!(openai[i]["function"]["parameters"], spec.input_schema);
            assert_eq!(anthropic[i]["name"], spec.name);
            assert_eq!(anthropic[i]["input_schema"]["type"], "object");
        }
    }

    #[test]
    fn tool_calls_map_to_the_routes_that_carry_them_out() {
        let r = request(
            "run_in_session",
            &json!({"session_id": "abc-1", "code": "x"}),
        )
        .unwrap();
        assert_eq!(r.path, "/v1/sessions/abc-1/execute");
        assert_eq!(r.body, Some(json!({"code": "x"})));
        assert_eq!(
            request("close_python_session", &json!({"session_id": "s"}))
                .unwrap()
                .method,
            axum::http::Method::DELETE
        );
        assert!(matches!(
            request(
                "run_in_session",
                &json!({"session_id": "../files", "code": "x"})
            ),
            Err(ToolCallError::BadArguments { .. })
        ));
        assert!(matches!(
            request("rm_rf", &json!({})),
            Err(ToolCallError::UnknownTool(_))
        ));
        assert!(matches!(
            request("run_python", &json!("print(1)")),
            Err(ToolCallError::BadArguments { .. })
        ));
    }

    #[test]
    fn arguments_the_schema_does_not_name_are_refused_by_name() {
        let specs = catalog(&ctx());
        let spec = |name: &str| specs.iter().find(|s| s.name == name).unwrap();
        assert_eq!(
            check_arguments(
                spec("run_python"),
                &json!({"code": "print('é')", "bogus": 1})
            ),
            Err(ToolCallError::BadArguments {
                tool: "run_python".into(),
                problem: "unknown argument `bogus`; it takes code, files, timeout_ms".into()
            })
        );
        assert_eq!(
            check_arguments(spec("list_packages"), &json!({"x": 1, "y": 2}))
                .unwrap_err()
                .to_string(),
            "tool list_packages: unknown arguments `x`, `y`; it takes no arguments"
        );
        assert_eq!(
            check_arguments(
                spec("run_in_session"),
                &json!({"session_id": "s", "code": "1"})
            ),
            Ok(())
        );
        assert!(check_arguments(spec("run_python"), &json!("print(1)")).is_err());
    }
}
