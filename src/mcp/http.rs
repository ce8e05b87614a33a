//! The HTTP layer of `/mcp` in front of rmcp's transport: the `Host` check, the body limit
//! (`limits.max_request_bytes`), a 400 for a body that is not JSON or not one JSON-RPC
//! message, the client's
//! token at `initialize`, `notifications/cancelled` applied to the call it names, and error
//! bodies in the service's JSON shape that MCP clients also read as JSON-RPC errors.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::calls::{Client, InFlight, SESSION_HEADER};
use crate::api::error_bodies::{declares_json, plain_error};
use crate::api::json_kind;
use crate::error::ErrorCode;

/// How much of a body of unknown length over the limit is read (and dropped) so its sender
/// sees the 413.
const MAX_DRAIN: usize = 64 << 20;

/// JSON-RPC's codes for a request refused before it was read, and for a body that is not JSON.
const INVALID_REQUEST: i64 = -32600;
const PARSE_ERROR: i64 = -32700;
const INTERNAL_ERROR: i64 = -32603;
const INVALID_PARAMS: i64 = -32602;

/// What [`guard`] needs: the configuration it enforces and the calls in flight.
pub struct Guard {
    allowed_hosts: Vec<String>,
    max_request_bytes: usize,
    calls: Arc<InFlight>,
}

impl Guard {
    pub fn new(allowed_hosts: Vec<String>, max_request_bytes: usize, calls: Arc<InFlight>) -> Self {
        Self {
            allowed_hosts,
            max_request_bytes,
            calls,
        }
    }
}

/// An error of `/mcp`'s HTTP layer: the service's `{"detail", "code"}`, and in the same
/// object a JSON-RPC error (`id` null: the request was not read), which is what MCP clients
/// surface to their user when a POST fails.
pub fn error_response(status: StatusCode, detail: &str, rpc_code: i64) -> Response {
    error_response_to(status, detail, rpc_code, Value::Null)
}

/// [`error_response`] answering the request `id` (one whose `id` could be read).
fn error_response_to(status: StatusCode, detail: &str, rpc_code: i64, id: Value) -> Response {
    let body = json!({
        "detail": detail,
        "code": ErrorCode::for_status(status),
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": rpc_code, "message": detail},
    });
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Middleware around rmcp's service and the key check in front of it: rmcp's plain-text
/// errors (a 405 for `GET`, a 406 for a missing `Accept`, a 415, a 400 for a bad protocol
/// version header) get the body of [`error_response`]; the service's own JSON errors (the
/// key check's 401) get its JSON-RPC part added, so an MCP client shows their `detail`
/// instead of a bare "error response". JSON-RPC answers and streams pass unchanged.
pub async fn json_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let (parts, text) = match plain_error(next.run(request).await).await {
        Ok(plain) => plain,
        Err(response) => return with_rpc_error(response).await,
    };
    let status = parts.status;
    let detail = match status {
        StatusCode::METHOD_NOT_ALLOWED => format!("{method} is not allowed on /mcp; use POST"),
        _ => text,
    };
    let mut response = error_response(status, &detail, rpc_code_for(status));
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            response.headers_mut().append(name, value.clone());
        }
    }
    response
}

/// The JSON-RPC code of an HTTP refusal: the server's fault, or the request's.
fn rpc_code_for(status: StatusCode) -> i64 {
    if status.is_server_error() {
        INTERNAL_ERROR
    } else {
        INVALID_REQUEST
    }
}

/// A service error body (`{"detail", "code"}`, no `jsonrpc`) with the JSON-RPC error of
/// [`error_response`] added to the same object, and rmcp's own JSON-RPC refusal with an
/// HTTP error status (a JSON-RPC response sent to the server) with the service's `detail`
/// and `code` added; any other response as it was.
async fn with_rpc_error(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || !declares_json(response.headers())
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // The service's error bodies are a line or two; anything longer is not one of them.
    let bytes = match axum::body::to_bytes(body, 64 << 10).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return error_response(status, "the error body could not be read", INTERNAL_ERROR);
        }
    };
    let mut object = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(object)) => object,
        _ => return Response::from_parts(parts, Body::from(bytes)),
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    if object.contains_key("jsonrpc") {
        // rmcp's own: the API's fields added, from its JSON-RPC error.
        let message = text(object.get("error").and_then(|e| e.get("message")));
        let Some(message) = message.filter(|_| !object.contains_key("detail")) else {
            return Response::from_parts(parts, Body::from(bytes));
        };
        object.insert("detail".into(), message.into());
        object.insert("code".into(), json!(ErrorCode::for_status(status)));
    } else {
        // The service's: its JSON-RPC error added, from its detail.
        let Some(detail) = text(object.get("detail")) else {
            return Response::from_parts(parts, Body::from(bytes));
        };
        object.insert("jsonrpc".into(), "2.0".into());
        object.insert("id".into(), Value::Null);
        object.insert(
            "error".into(),
            json!({"code": rpc_code_for(status), "message": detail}),
        );
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(Value::Object(object).to_string()))
}

/// Middleware in front of rmcp's service (see the module's documentation).
pub async fn guard(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    if let Some(refusal) = host_refusal(request.uri(), request.headers(), &guard.allowed_hosts) {
        return refusal;
    }
    // Nothing to close: `/mcp` keeps no session. The client's token names nothing stored.
    if request.method() == Method::DELETE {
        if request.headers().contains_key(SESSION_HEADER) {
            return Response::new(Body::empty());
        }
        return error_response(
            StatusCode::BAD_REQUEST,
            &format!(
                "DELETE /mcp ends the session its {SESSION_HEADER} header names, and this \
                 request has none; MCP requests are POSTs"
            ),
            INVALID_REQUEST,
        );
    }
    let json_post = request.method() == Method::POST
        && request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|e| e.trim().eq_ignore_ascii_case("application/json"))
            });
    if !json_post {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match read_body(&parts.headers, body, guard.max_request_bytes).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let message: Value = match serde_json::from_slice(&bytes) {
        Ok(message) => message,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &format!("the request body is not valid JSON ({e}); send one JSON-RPC message"),
                PARSE_ERROR,
            );
        }
    };
    if let Some(refusal) = not_a_message(&message) {
        return refusal;
    }
    let method = message["method"].as_str().unwrap_or_default();
    let is_request = message.get("id").is_some_and(|id| !id.is_null());
    let initialize = is_request && method == "initialize";
    let cancelled = (!is_request && method == "notifications/cancelled")
        .then(|| message["params"].get("requestId").cloned())
        .flatten()
        .and_then(|id| Some((Client::of(&parts.headers)?, id.to_string())));
    let mut response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    // rmcp accepted the notification (the Host, the headers and the message were valid).
    if let Some((client, request_id)) = cancelled
        && response.status() == StatusCode::ACCEPTED
    {
        let found = guard.calls.cancel(client, request_id.clone());
        tracing::info!(request_id, found, "MCP call cancelled by its client");
    }
    // The client's token: it sends it back on every request, so that a cancellation names
    // its own call. It is random and names nothing stored, so any replica accepts it.
    if initialize
        && response.status() == StatusCode::OK
        && !response.headers().contains_key(SESSION_HEADER)
        && let Ok(token) =
            HeaderValue::from_str(&format!("mcp_{}", uuid::Uuid::new_v4().as_simple()))
    {
        response.headers_mut().insert(SESSION_HEADER, token);
    }
    response
}

/// The 400 for a JSON body that is not one JSON-RPC 2.0 message (rmcp would answer it with a
/// 415, as if the content type were wrong): a batch (a JSON array), which MCP's current
/// protocol no longer has, or anything else that is not a request, a notification or a
/// response to one of ours.
fn not_a_message(message: &Value) -> Option<Response> {
    let detail = if message.is_array() {
        "the request body is a JSON array (a JSON-RPC batch); batches are not supported: POST \
         each JSON-RPC message on its own"
            .to_owned()
    } else {
        // rmcp's error says no more than "unrecognized JSON-RPC message", whatever is wrong.
        serde_json::from_value::<rmcp::model::ClientJsonRpcMessage>(message.clone()).err()?;
        // A request whose `id` and `method` read well but whose `params` are not an object
        // is answered as JSON-RPC says: invalid params, to that id.
        let id = message
            .get("id")
            .filter(|id| id.is_string() || id.is_i64() || id.is_u64());
        let method = message.get("method").and_then(Value::as_str);
        let params = message.get("params");
        if let (Some(id), Some(method), Some(params)) = (id, method, params)
            && message.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
            && !params.is_object()
        {
            return Some(error_response_to(
                StatusCode::BAD_REQUEST,
                &format!(
                    "the `params` of {method:?} are {}, not an object: send them as a JSON \
                     object (for tools/call: {{\"name\": ..., \"arguments\": {{...}}}})",
                    json_kind(params)
                ),
                INVALID_PARAMS,
                id.clone(),
            ));
        }
        "the request body is JSON but not a JSON-RPC 2.0 request, notification or response: \
         send one object with \"jsonrpc\": \"2.0\", a `method` (one MCP defines) and its \
         `params`, and an `id` for a request"
            .to_owned()
    };
    Some(error_response(
        StatusCode::BAD_REQUEST,
        &detail,
        INVALID_REQUEST,
    ))
}

/// Reads a body of at most `limit` bytes; a larger one is a 413 that says the limit. One
/// whose `Content-Length` says so is refused before it is read (`server::unread_body`
/// drains its rest, or closes). One of unknown length is read and dropped past the limit
/// (up to [`MAX_DRAIN`]) before the answer: a client still sending when the answer comes
/// (the official Python SDK is one) would otherwise see a reset connection instead.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, Response> {
    let too_large = || {
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "the request body is over {limit} bytes (limits.max_request_bytes). MCP has no \
                 tool to upload data: send less in one call, e.g. split the code over several \
                 run_in_session calls (a session from create_python_session keeps its variables \
                 between them), or have the code generate or compute large data rather than \
                 embed it. A client of the HTTP API can upload it with POST /v1/files and \
                 stage it with `files`."
            ),
            INVALID_REQUEST,
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    let mut dropped = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            error_response(
                StatusCode::BAD_REQUEST,
                &format!("the request body could not be read: {e}"),
                INVALID_REQUEST,
            )
        })?;
        if dropped > 0 || bytes.len() + chunk.len() > limit {
            dropped += chunk.len();
            if dropped > MAX_DRAIN {
                break;
            }
            continue;
        }
        bytes.extend_from_slice(&chunk);
    }
    if dropped > 0 {
        return Err(too_large());
    }
    Ok(Bytes::from(bytes))
}

/// The same rule as rmcp's own check (which stays on behind this one): the `Host` (or the
/// URI's authority) must be one of `allowed` (`name` allows any port, `name:port` that
/// one); an empty list allows any. The answer to a request that breaks it, if it does.
fn host_refusal(uri: &Uri, headers: &HeaderMap, allowed: &[String]) -> Option<Response> {
    let authority = match headers.get(header::HOST) {
        Some(host) => host
            .to_str()
            .ok()
            .and_then(|h| axum::http::uri::Authority::try_from(h).ok()),
        None => uri.authority().cloned(),
    };
    let Some(authority) = authority else {
        return Some(error_response(
            StatusCode::BAD_REQUEST,
            "the Host header is missing or is not a host name with an optional port",
            INVALID_REQUEST,
        ));
    };
    if host_is_allowed(&authority, allowed) {
        return None;
    }
    tracing::warn!(host = %authority, "MCP request with a Host that is not allowed");
    Some(error_response(
        StatusCode::FORBIDDEN,
        &format!(
            "the Host {:?} is not allowed on /mcp (a defence against DNS rebinding); add the \
             name clients use to reach the service to mcp.allowed_hosts",
            authority.as_str()
        ),
        INVALID_REQUEST,
    ))
}

fn host_is_allowed(host: &axum::http::uri::Authority, allowed: &[String]) -> bool {
    let normalize = |h: &str| h.trim_matches(['[', ']']).to_ascii_lowercase();
    let name = normalize(host.host());
    allowed.is_empty()
        || allowed.iter().any(|entry| {
            let entry = entry.trim();
            match axum::http::uri::Authority::try_from(entry) {
                Ok(a) => {
                    normalize(a.host()) == name
                        && a.port_u16()
                            .is_none_or(|port| host.port_u16() == Some(port))
                }
                Err(_) => !entry.is_empty() && normalize(entry) == name,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::uri::Authority;

    fn allowed(host: &str, list: &[&str]) -> bool {
        let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        host_is_allowed(&Authority::try_from(host).unwrap(), &list)
    }

    #[test]
    fn hosts_match_by_name_and_by_port_when_the_entry_names_one() {
        let list = [
            "localhost",
            "snakecage:80",
            "::1",
            "Snakecage.ns.svc.cluster.local",
        ];
        assert!(allowed("localhost:8000", &list));
        assert!(allowed("LOCALHOST", &list));
        assert!(allowed("[::1]:8000", &list));
        assert!(allowed("snakecage:80", &list));
        assert!(!allowed("snakecage:8000", &list));
        assert!(!allowed("snakecage", &list));
        assert!(allowed("snakecage.ns.svc.cluster.local", &list));
        assert!(!allowed("evil.example", &list));
        assert!(allowed("anything", &[]));
    }

    #[tokio::test]
    async fn an_error_is_both_the_service_shape_and_a_json_rpc_error() {
        let response = error_response(StatusCode::PAYLOAD_TOO_LARGE, "too big", INVALID_REQUEST);
        assert_eq!(response.status(), 413);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["detail"], "too big");
        assert_eq!(body["code"], "payload_too_large");
        assert_eq!(body["error"], json!({"code": -32600, "message": "too big"}));
        assert_eq!(body["id"], Value::Null);
    }
}
