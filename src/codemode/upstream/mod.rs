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
//!
//! - [`http`]: the streamable HTTP transport; [`stdio`]: the command's, whose stdout is
//!   read through a [`line_guard`] and whose stderr is logged ([`server_log`]).
//! - [`too_large`]: an answer too large to read fails the one call it answers, with the
//!   `limit` error of a result over `tools.max_result_bytes`; the link goes on.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{ClientInitializeError, RoleClient, RunningService, ServiceError};
use rmcp::transport::DynamicTransportError;
use serde_json::Value;
use snakecage_worker::jsondepth;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};
use snakecage_worker::toolspec::{ToolSpec, valid_name};

use super::catalog::failed;
use super::tls::TrustRoots;
use crate::config::McpServerConfig;

mod http;
mod line_guard;
mod server_log;
mod stdio;
mod too_large;

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
    /// The most bytes read of one message ([`too_large::message_limit`]).
    limit: usize,
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
/// initialises the session; no message of more than `limit` bytes is read from it.
async fn open(
    config: &McpServerConfig,
    roots: &TrustRoots,
    limit: usize,
) -> Result<Client, String> {
    match (&config.url, &config.command) {
        (Some(url), _) => {
            let transport = http::transport(url, roots, limit, &config.name)?;
            ().serve(transport)
                .await
                .map_err(|e| format!("connecting to {url}: {}", plainly(&e)))
        }
        (None, Some(argv)) if !argv.is_empty() => {
            let transport = stdio::ChildTransport::spawn(&config.name, argv, &config.env, limit)
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
    /// Its messages are read up to what results of `max_result_bytes` take.
    pub async fn connect(
        config: &McpServerConfig,
        roots: &TrustRoots,
        max_result_bytes: usize,
    ) -> Result<(Self, Vec<(String, ToolSpec)>), String> {
        let limit = too_large::message_limit(max_result_bytes);
        let client = open(config, roots, limit).await?;
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
                limit,
                link: Mutex::new(Link::Up(Arc::new(client))),
            },
            tools,
        ))
    }

    /// Calls `tool`; a result is read if its message fits (see [`too_large`]), and then held
    /// to `max_result_bytes` with every provider's.
    pub async fn call(
        self: &Arc<Self>,
        tool: &str,
        arguments: Value,
        max_result_bytes: usize,
    ) -> ToolOutcome {
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
            // Its answer was too large to read: the link is fine.
            Err(ServiceError::McpError(e)) if too_large::limit_of(&e).is_some() => {
                return ToolOutcome::error(
                    ToolErrorKind::Limit,
                    format!(
                        "the tool's result is larger than the {max_result_bytes} bytes allowed \
                         (tools.max_result_bytes): MCP server '{}' answered with a message of \
                         more than the {} bytes read of one",
                        self.name, self.limit
                    ),
                );
            }
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
        let Some((config, roots, limit)) = upstream
            .upgrade()
            .map(|u| (u.config.clone(), u.roots.clone(), u.limit))
        else {
            return;
        };
        let result = tokio::time::timeout(ATTEMPT_TIMEOUT, open(&config, &roots, limit))
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
