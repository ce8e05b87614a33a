//! `[tools]`: Code Mode. Per-run limits on tool calls, and the tools operators offer to
//! sandboxed code: `[[tools.http]]` endpoints the supervisor calls, `[[tools.mcp]]`
//! upstream MCP servers whose tools it lists and forwards. Each may be limited to some
//! API keys (`tenants`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Tool calls one run may make; the next one raises `ToolLimitError`.
    pub max_calls_per_run: u32,
    /// How long one call may wait for its answer; then it raises `ToolTimeoutError`.
    pub call_timeout_ms: u64,
    /// Tool calls one run may have in flight at once (its threads or asyncio tasks fan
    /// out); a call past it waits in the worker for a free slot.
    pub max_concurrent_calls: u32,
    /// Largest arguments of one call (as JSON).
    pub max_argument_bytes: usize,
    /// Largest result of one call (as JSON; an HTTP tool's response body).
    pub max_result_bytes: usize,
    /// Tools declared by a caller in one request (answered by the caller over SSE).
    pub max_caller_tools: usize,
    /// HTTP endpoints offered as tools.
    pub http: Vec<HttpToolConfig>,
    /// Upstream MCP servers whose tools are offered.
    pub mcp: Vec<McpServerConfig>,
    /// CA certificates (PEM) trusted for https:// tools and MCP servers, on top of the
    /// system's roots (`tls` builds only).
    pub ca_file: Option<PathBuf>,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            max_calls_per_run: 1000,
            call_timeout_ms: 30_000,
            max_concurrent_calls: 8,
            max_argument_bytes: 1 << 20,
            max_result_bytes: 4 << 20,
            max_caller_tools: 128,
            http: Vec::new(),
            mcp: Vec::new(),
            ca_file: None,
        }
    }
}

/// One `[[tools.http]]` entry: a call becomes one request to `url`. GET sends the
/// arguments as query parameters, other methods as a JSON body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    #[serde(
        alias = "schema",
        default = "snakecage_worker::toolspec::empty_object_schema"
    )]
    pub parameters: Value,
    pub url: String,
    #[serde(default = "default_method")]
    pub method: String,
    /// Header values given here (not secrets).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Header name ⇒ environment variable holding its value (secrets stay out of the file).
    #[serde(default)]
    pub headers_from_env: BTreeMap<String, String>,
    /// API key names (tenants) that see this tool; absent: every caller.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}

fn default_method() -> String {
    "POST".into()
}

/// One `[[tools.mcp]]` entry: exactly one of `url` (streamable HTTP) and `command` (a
/// stdio server the supervisor starts). Its tools are offered as `<name>_<tool>`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    pub name: String,
    #[serde(default)]
    pub url: Option<String>,
    /// Program and arguments, e.g. `["/usr/bin/python3", "server.py"]`.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Environment of a stdio server (nothing else of the supervisor's is passed on).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}

/// The most `max_concurrent_calls` may be. An asyncio program's calls in flight each have
/// a thread of the worker, whose stack (512 KiB) counts against the run's memory limit:
/// 64 take 32 MiB of the default 256 MB.
pub const MAX_CONCURRENT_CALLS: u32 = 64;

/// The error for `what` (https://, a CA file) in a build without the `tls` feature.
pub fn needs_tls(what: &str) -> String {
    format!("{what} needs a build with the `tls` feature (cargo build --features tls)")
}

/// Whether `url` can be reached by this build (https needs the `tls` feature).
fn check_scheme(at: &str, url: &reqwest::Url) -> Result<(), String> {
    match url.scheme() {
        "http" => Ok(()),
        "https" if cfg!(feature = "tls") => Ok(()),
        "https" => Err(needs_tls(&format!("{at}: https://"))),
        _ => Err(format!("{at}: url must be an http:// or https:// URL")),
    }
}

impl ToolsConfig {
    /// Checks names, URLs, methods and secrets; the message says what to fix.
    pub fn validate(&self) -> Result<(), String> {
        use snakecage_worker::toolspec::valid_name;
        if self.max_calls_per_run == 0 || self.call_timeout_ms == 0 {
            return Err(
                "tools.max_calls_per_run and tools.call_timeout_ms must be positive".into(),
            );
        }
        if self.max_concurrent_calls > MAX_CONCURRENT_CALLS {
            return Err(format!(
                "tools.max_concurrent_calls is {} but may be at most {MAX_CONCURRENT_CALLS} (each \
                 call in flight of an asyncio program has a thread in the worker, whose stack \
                 counts against the run's memory limit); lower it in the configuration file or \
                 SNAKECAGE_TOOLS__MAX_CONCURRENT_CALLS",
                self.max_concurrent_calls
            ));
        }
        // A call and its answer each travel in one frame of the job socket.
        let frame_room = snakecage_worker::frame::MAX_FRAME_LEN / 2;
        if !(2..=frame_room).contains(&self.max_argument_bytes)
            || !(2..=frame_room).contains(&self.max_result_bytes)
        {
            return Err(format!(
                "tools.max_argument_bytes and tools.max_result_bytes must be between 2 and {frame_room}"
            ));
        }
        if self.ca_file.is_some() && !cfg!(feature = "tls") {
            return Err(needs_tls("tools.ca_file"));
        }
        let mut names = std::collections::BTreeSet::new();
        for tool in &self.http {
            let at = format!("tools.http '{}'", tool.name);
            if !valid_name(&tool.name) {
                return Err(format!(
                    "{at}: a tool name is 1-64 ASCII letters, digits, '_', '-' or '.'"
                ));
            }
            if !names.insert(tool.name.clone()) {
                return Err(format!("{at}: the name is used twice"));
            }
            let url = reqwest::Url::parse(&tool.url).map_err(|e| format!("{at}: url: {e}"))?;
            check_scheme(&at, &url)?;
            if url.host_str().is_none() {
                return Err(format!("{at}: url must name a host"));
            }
            if !matches!(
                tool.method.as_str(),
                "GET" | "POST" | "PUT" | "PATCH" | "DELETE"
            ) {
                return Err(format!(
                    "{at}: method must be GET, POST, PUT, PATCH or DELETE"
                ));
            }
            if !tool.parameters.is_object() {
                return Err(format!("{at}: parameters must be a JSON Schema object"));
            }
            for var in tool.headers_from_env.values() {
                if std::env::var_os(var).is_none() {
                    return Err(format!("{at}: environment variable {var} is not set"));
                }
            }
        }
        let mut servers = std::collections::BTreeSet::new();
        for server in &self.mcp {
            let at = format!("tools.mcp '{}'", server.name);
            if server.name.is_empty()
                || !server
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(format!(
                    "{at}: a server name is ASCII letters, digits and '_'"
                ));
            }
            if !servers.insert(server.name.clone()) {
                return Err(format!("{at}: the name is used twice"));
            }
            match (&server.url, &server.command) {
                (Some(url), None) => {
                    let url = reqwest::Url::parse(url).map_err(|e| format!("{at}: url: {e}"))?;
                    check_scheme(&at, &url)?;
                }
                (None, Some(argv)) if !argv.is_empty() => {
                    if !is_a_command(&argv[0], server.env.get("PATH").map(String::as_str)) {
                        return Err(format!(
                            "{at}: command {:?} is not an executable file, nor one found on \
                             PATH; give its absolute path",
                            argv[0]
                        ));
                    }
                }
                _ => return Err(format!("{at}: give exactly one of url and command")),
            }
        }
        Ok(())
    }
}

/// Whether `program` names an executable file: as a path when it has a `/`, else on
/// the server's own `PATH` (its `env`) or ours, where the spawn will look for it. Checked
/// with the configuration, so a typo stops start-up before the zygotes preload, not after
/// the service says it listens.
fn is_a_command(program: &str, server_path: Option<&str>) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(std::path::Path::new(program));
    }
    let on = |path: &std::ffi::OsStr| {
        std::env::split_paths(path).any(|dir| executable(&dir.join(program)))
    };
    server_path.is_some_and(|p| on(p.as_ref())) || std::env::var_os("PATH").is_some_and(|p| on(&p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(name: &str, url: &str) -> HttpToolConfig {
        HttpToolConfig {
            name: name.into(),
            description: "d".into(),
            parameters: snakecage_worker::toolspec::empty_object_schema(),
            url: url.into(),
            method: "GET".into(),
            headers: BTreeMap::new(),
            headers_from_env: BTreeMap::new(),
            tenants: None,
        }
    }

    fn invalid(config: ToolsConfig) -> String {
        config.validate().unwrap_err()
    }

    #[test]
    fn a_stdio_server_whose_command_is_nowhere_is_refused_with_the_configuration() {
        assert!(is_a_command("sh", None) && is_a_command("/bin/sh", None));
        // On the server's own PATH only.
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("serveur-é");
        std::fs::write(&own, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&own, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert!(is_a_command("serveur-é", dir.path().to_str()));
        assert!(!is_a_command("serveur-é", None));
        assert!(
            !is_a_command("sans-serveur-mcp-é", None) && !is_a_command("/nulle/part/serveur", None)
        );
        let plain = tempfile::NamedTempFile::new().unwrap(); // mode 0600
        assert!(
            !is_a_command(plain.path().to_str().unwrap(), None),
            "a file, not executable"
        );
        let server = |program: &str| ToolsConfig {
            mcp: vec![McpServerConfig {
                name: "m".into(),
                url: None,
                command: Some(vec![program.into(), "serveur.py".into()]),
                env: BTreeMap::new(),
                tenants: None,
            }],
            ..ToolsConfig::default()
        };
        let e = invalid(server("pyhton3-é"));
        assert!(
            e.contains(r#"command "pyhton3-é" is not an executable file"#),
            "{e}"
        );
        server("sh").validate().unwrap();
        assert!(!is_a_command("/usr/bin", None), "a directory");
    }

    #[test]
    fn bad_tool_configurations_say_what_to_fix() {
        let with = |tools: Vec<HttpToolConfig>| ToolsConfig {
            http: tools,
            ..ToolsConfig::default()
        };
        assert!(
            with(vec![http("ok", "http://127.0.0.1:9/x")])
                .validate()
                .is_ok()
        );
        assert!(invalid(with(vec![http("a b", "http://h/")])).contains("a tool name is"));
        assert!(invalid(with(vec![http("a", "ftp://h/")])).contains("http:// or https://"));
        assert!(
            invalid(with(vec![http("a", "http://h/"), http("a", "http://h/")]))
                .contains("used twice")
        );
        let mut secret = http("a", "http://h/");
        secret
            .headers_from_env
            .insert("Authorization".into(), "SNAKECAGE_TEST_SURELY_UNSET".into());
        assert!(invalid(with(vec![secret])).contains("SNAKECAGE_TEST_SURELY_UNSET is not set"));
        if !cfg!(feature = "tls") {
            assert!(invalid(with(vec![http("a", "https://h/")])).contains("--features tls"));
        }
        let both = McpServerConfig {
            name: "m".into(),
            url: Some("http://h/mcp".into()),
            command: Some(vec!["x".into()]),
            env: BTreeMap::new(),
            tenants: None,
        };
        let config = ToolsConfig {
            mcp: vec![both],
            ..ToolsConfig::default()
        };
        assert!(invalid(config).contains("exactly one of url and command"));
        let config = ToolsConfig {
            max_result_bytes: usize::MAX,
            ..ToolsConfig::default()
        };
        assert!(invalid(config).contains("must be between 2 and"));
        let calls = |n| ToolsConfig {
            max_concurrent_calls: n,
            ..ToolsConfig::default()
        };
        calls(MAX_CONCURRENT_CALLS).validate().unwrap();
        assert!(
            invalid(calls(MAX_CONCURRENT_CALLS + 1))
                .starts_with("tools.max_concurrent_calls is 65 but may be at most 64 ("),
            "{}",
            invalid(calls(MAX_CONCURRENT_CALLS + 1))
        );
    }
}
