//! A streamable HTTP upstream: rmcp's reqwest client, trusting the operator's roots, with
//! every answer held to [`message_limit`](super::too_large::message_limit). A POST's answer
//! past it (rmcp's fixed 16 MiB for a JSON body, the configured limit for an SSE event) is
//! replaced by [`too_large::answer`] for that request, so the one call fails and the
//! session goes on; rmcp alone would end the call as if the connection had been lost.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, RequestId};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::Sse;

use super::too_large;
use crate::codemode::tls::TrustRoots;

/// How many redirects one request to an upstream follows.
const MAX_REDIRECTS: usize = 10;

/// How rmcp's SSE reader says an event was over the limit. Its error type is private, so
/// its message is the only handle; the HTTP test of an oversized answer fails if it
/// changes.
const EVENT_TOO_LARGE: &str = "SSE event exceeded the maximum size";

/// The transport to `server` at `url`, reading at most `limit` bytes of one SSE event.
pub fn transport(
    url: &str,
    roots: &TrustRoots,
    limit: usize,
    server: &str,
) -> Result<StreamableHttpClientTransport<Guarded>, String> {
    Ok(StreamableHttpClientTransport::with_client(
        Guarded {
            client: http_client(roots)?,
            server: server.into(),
        },
        StreamableHttpClientTransportConfig::with_uri(url).max_sse_event_size(limit),
    ))
}

/// rmcp's reqwest client, answering a request whose answer is too large with
/// [`too_large::answer`].
#[derive(Clone)]
pub struct Guarded {
    client: reqwest::Client,
    /// Its name, for the log.
    server: Arc<str>,
}

impl StreamableHttpClient for Guarded {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        // rmcp's worker sends with the sized variant below; this one is not guarded.
        self.client
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let id = request_id(&message);
        let answer = self
            .client
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        guard(answer, id, max_sse_event_size, &self.server)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.client
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.client
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.client
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        ClientJsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

/// The answer to request `id` (`None`: a notification or a response, which get no answer),
/// with a body or an SSE event (of at most `limit` bytes) too large to read replaced by
/// [`too_large::answer`].
fn guard(
    answer: Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>,
    id: Option<RequestId>,
    limit: usize,
    server: &Arc<str>,
) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
    let Some(id) = id else { return answer };
    match answer {
        Err(StreamableHttpError::ResponseBodyTooLarge { max_size }) => {
            tracing::warn!(%server, limit = max_size, "an upstream MCP server's answer was too large to read; the call it answers failed with a limit error");
            Ok(StreamableHttpPostResponse::Json(
                too_large::answer(id, max_size),
                None,
            ))
        }
        Ok(StreamableHttpPostResponse::Sse(events, session)) => {
            let server = server.clone();
            let events = events.map(move |event| match event {
                Err(SseError::Body(e)) if e.to_string().starts_with(EVENT_TOO_LARGE) => {
                    tracing::warn!(%server, limit, "an upstream MCP server's answer was too large to read; the call it answers failed with a limit error");
                    Ok(event_of(too_large::answer(id.clone(), limit)))
                }
                other => other,
            });
            Ok(StreamableHttpPostResponse::Sse(events.boxed(), session))
        }
        other => other,
    }
}

fn event_of(message: rmcp::model::ServerJsonRpcMessage) -> Sse {
    Sse {
        event: None,
        data: serde_json::to_string(&message).ok(),
        id: None,
        retry: None,
    }
}

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
