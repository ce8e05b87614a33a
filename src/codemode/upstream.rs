//! `[[tools.mcp]]`: an upstream MCP server (streamable HTTP, or a stdio command the
//! operator names) as an rmcp client. Its tools are listed once at start-up into the
//! catalog as `<server>_<tool>`, and each call is forwarded as `tools/call`. A result's
//! structured content is the Python value; otherwise its text (parsed as JSON when it is
//! JSON). `isError` results raise `ToolError` with the text as message.
//!
//! An upstream that goes away (its process died, its connection broke, an HTTP server
//! restarted and forgot the session) is reconnected in the background with backoff
//! (a stdio command is started again). Meanwhile each call fails at once with an
//! `unavailable` `ToolError` that says the server is unreachable, why, and when the next
//! attempt is; a call the server itself refuses (a JSON-RPC error) is not a lost link.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{ClientInitializeError, RoleClient, RunningService, ServiceError};
use rmcp::transport::DynamicTransportError;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::Value;
use snakecage_worker::jsondepth;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::{ToolSpec, valid_name};

use super::catalog::failed;
use super::tls::TrustRoots;
use crate::config::McpServerConfig;

type Client = RunningService<RoleClient, ()>;

/// The first wait before reconnecting, doubled after each failed attempt up to the last.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How long one reconnect attempt (start or connect, initialise) may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Upstream {
    name: String,
    config: McpServerConfig,
    /// The CA certificates trusted for an HTTPS upstream, kept for reconnects.
    roots: TrustRoots,
    link: Mutex<Link>,
}

/// The connection to the server, as calls find it.
enum Link {
    Up(Arc<Client>),
    /// Lost: a reconnect task is running.
    Down {
        error: String,
        since: Instant,
        attempts: u32,
        next_at: Instant,
    },
}

/// Starts the server (a command) or connects to it (a URL, trusting `roots` for HTTPS), and
/// initialises the session.
async fn open(config: &McpServerConfig, roots: &TrustRoots) -> Result<Client, String> {
    match (&config.url, &config.command) {
        (Some(url), _) => {
            let transport = StreamableHttpClientTransport::with_client(
                http_client(roots)?,
                StreamableHttpClientTransportConfig::with_uri(url.as_str()),
            );
            ().serve(transport)
                .await
                .map_err(|e| format!("connecting to {url}: {}", plainly(&e)))
        }
        (None, Some(argv)) if !argv.is_empty() => {
            let mut command = tokio::process::Command::new(&argv[0]);
            command.args(&argv[1..]).env_clear().envs(&config.env);
            let transport = TokioChildProcess::new(command)
                .map_err(|e| format!("starting {:?}: {e}", argv[0]))?;
            ().serve(transport)
                .await
                .map_err(|e| format!("initialising {:?}: {}", argv[0], plainly(&e)))
        }
        _ => Err("give exactly one of url and command".into()),
    }
}

impl Upstream {
    /// Connects, initialises and lists the server's tools: `(its name, the spec offered)`.
    pub async fn connect(
        config: &McpServerConfig,
        roots: &TrustRoots,
    ) -> Result<(Self, Vec<(String, ToolSpec)>), String> {
        let client = open(config, roots).await?;
        let listed = client
            .list_all_tools()
            .await
            .map_err(|e| format!("listing its tools: {}", plainly(&e)))?;
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
                config: config.clone(),
                roots: roots.clone(),
                link: Mutex::new(Link::Up(Arc::new(client))),
            },
            tools,
        ))
    }

    pub async fn call(self: &Arc<Self>, tool: &str, arguments: Value) -> ToolOutcome {
        let client = match self.client() {
            Ok(client) => client,
            Err(down) => return down,
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        let result = match client.call_tool(params).await {
            Ok(result) => result,
            // The server answered, refusing the call: the link is fine.
            Err(ServiceError::McpError(e)) => {
                return ToolOutcome::error(
                    ToolErrorKind::Unavailable,
                    format!("MCP server '{}': {e}", self.name),
                );
            }
            Err(e) => return self.lost(&client, plainly(&e)),
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
            None => match jsondepth::parse_result(text.as_bytes()) {
                Ok(Some(v)) => v,
                Ok(None) => Value::String(text),
                Err(depth) => {
                    return ToolOutcome::error(
                        ToolErrorKind::Limit,
                        jsondepth::too_deep("the tool's result", depth),
                    );
                }
            },
        };
        ToolOutcome::Ok { result: value }
    }

    /// The live client, or the error a call gets while the server is unreachable. A
    /// client whose transport has ended (a stdio server that exited) is lost here.
    fn client(self: &Arc<Self>) -> Result<Arc<Client>, ToolOutcome> {
        let client = match &*self.link.lock().expect("mcp link lock") {
            Link::Up(client) => client.clone(),
            down @ Link::Down { .. } => return Err(self.unavailable(down)),
        };
        if client.is_transport_closed() {
            return Err(self.lost(&client, "the connection is closed".into()));
        }
        Ok(client)
    }

    /// Marks `client` lost (unless a reconnect already replaced it), starts reconnecting,
    /// and answers the call that found it so.
    fn lost(self: &Arc<Self>, client: &Arc<Client>, error: String) -> ToolOutcome {
        let mut link = self.link.lock().expect("mcp link lock");
        if let Link::Up(current) = &*link
            && Arc::ptr_eq(current, client)
        {
            tracing::warn!(server = %self.name, %error, "lost the upstream MCP server; reconnecting");
            *link = Link::Down {
                error,
                since: Instant::now(),
                attempts: 0,
                next_at: Instant::now(),
            };
            tokio::spawn(reconnect(Arc::downgrade(self)));
        }
        match &*link {
            down @ Link::Down { .. } => self.unavailable(down),
            Link::Up(_) => ToolOutcome::error(
                ToolErrorKind::Unavailable,
                format!(
                    "MCP server '{}': the connection broke during the call and was remade; call again",
                    self.name
                ),
            ),
        }
    }

    fn unavailable(&self, down: &Link) -> ToolOutcome {
        let Link::Down {
            error,
            since,
            attempts,
            next_at,
        } = down
        else {
            unreachable!("called for a lost link only");
        };
        let next = next_at.saturating_duration_since(Instant::now());
        ToolOutcome::error(
            ToolErrorKind::Unavailable,
            format!(
                "MCP server '{}' is unreachable ({error}) since {:.1} s; reconnecting in the \
                 background ({attempts} attempts so far, the next in {:.1} s): call again later",
                self.name,
                since.elapsed().as_secs_f64(),
                next.as_secs_f64(),
            ),
        )
    }
}

impl Upstream {
    /// Records a reconnect attempt; true when the link is up again.
    fn record(&self, result: Result<Client, String>, backoff: Duration) -> bool {
        let mut link = self.link.lock().expect("mcp link lock");
        match result {
            Ok(client) => {
                tracing::info!(server = %self.name, "upstream MCP server reconnected");
                *link = Link::Up(Arc::new(client));
                true
            }
            Err(e) => {
                if let Link::Down {
                    error,
                    attempts,
                    next_at,
                    ..
                } = &mut *link
                {
                    *error = e;
                    *attempts += 1;
                    *next_at = Instant::now() + backoff;
                    tracing::warn!(server = %self.name, error = %error, attempts = *attempts, "reconnecting the upstream MCP server failed; retrying");
                }
                false
            }
        }
    }
}

/// Reconnects with backoff until it succeeds or the upstream is dropped (the service
/// stopped).
async fn reconnect(upstream: Weak<Upstream>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let Some((config, roots)) = upstream
            .upgrade()
            .map(|u| (u.config.clone(), u.roots.clone()))
        else {
            return;
        };
        let result = tokio::time::timeout(ATTEMPT_TIMEOUT, open(&config, &roots))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer to the MCP handshake within {} s",
                    ATTEMPT_TIMEOUT.as_secs()
                ))
            });
        match upstream.upgrade() {
            Some(upstream) if !upstream.record(result, backoff) => {}
            _ => return,
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// An rmcp error in words: its transport errors read `Transport [<the transport's Rust
/// type, generics and all>] error: …`, which users of a tool have no use for. What is
/// left is each cause, outermost first (`error sending request for url (…): client error
/// (Connect): tcp connect error: Connection refused (os error 111)`).
fn plainly(e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(ServiceError::TransportSend(transport)) = e.downcast_ref() {
        return format!("sending to it failed: {}", plainly(transport));
    }
    if let Some(ClientInitializeError::TransportError { error, context }) = e.downcast_ref() {
        return format!("{} ({context})", plainly(error));
    }
    if let Some(transport) = e.downcast_ref::<DynamicTransportError>() {
        return causes(&*transport.error);
    }
    causes(e)
}

/// `e` and its sources, outermost first; a message that ends with its source's (as
/// `Client error: {0}` does) is cut before it.
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        next = e.source();
        let mut text = e.to_string();
        if let Some(inner) = next.map(ToString::to_string)
            && !inner.is_empty()
            && let Some(own) = text.strip_suffix(&inner)
        {
            text = own.trim_end_matches([' ', ':']).to_owned();
        }
        if !text.is_empty() {
            parts.push(text);
        }
    }
    parts.join(": ")
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn refused() -> DynamicTransportError {
        let io = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
        DynamicTransportError::from_parts(
            "rmcp::transport::worker::WorkerTransport<rmcp::transport::Worker<reqwest::Client>>",
            std::any::TypeId::of::<()>(),
            Box::new(io),
        )
    }

    #[test]
    fn transport_errors_read_without_rust_type_names() {
        assert!(refused().to_string().contains("rmcp::transport"));
        assert_eq!(
            plainly(&ServiceError::TransportSend(refused())),
            "sending to it failed: Connection refused"
        );
        let init = ClientInitializeError::TransportError {
            error: refused(),
            context: "send initialize request".into(),
        };
        assert_eq!(
            plainly(&init),
            "Connection refused (send initialize request)"
        );
        assert_eq!(plainly(&ServiceError::TransportClosed), "Transport closed");
        // A message that repeats its source's is cut before it.
        #[derive(Debug, thiserror::Error)]
        #[error("Client error: {0}")]
        struct Client(#[source] io::Error);
        let client = Client(io::Error::other("tcp connect error"));
        assert_eq!(causes(&client), "Client error: tcp connect error");
    }
}
