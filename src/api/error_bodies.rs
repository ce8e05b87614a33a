//! The error bodies of the layers below the handlers: the router's 405 and an extractor's
//! plain-text rejection get the JSON body of an [`ApiError`] (`detail`, `code`), and a
//! 405 names the methods to use.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::json;

#[cfg(doc)]
use crate::error::ApiError;
use crate::error::ErrorCode;

/// Largest error body of a lower layer that is rewritten (theirs are a line of text).
const MAX_FOREIGN_ERROR_BODY: usize = 64 << 10;

/// Whether `headers` say the body is JSON (`application/json`, with or without parameters).
pub fn declares_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
}

/// An error response without a JSON body (a router's or extractor's plain text, a library
/// service's): its parts and its text, trimmed, or the status's reason when it has none.
/// Any other response (a success, a JSON error, a stream) is handed back untouched.
pub async fn plain_error(
    response: Response,
) -> Result<(axum::http::response::Parts, String), Response> {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || declares_json(response.headers())
    {
        return Err(response);
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_FOREIGN_ERROR_BODY)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let text = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    Ok((parts, text))
}

/// Middleware: an error answered below the handlers (axum's 405 with its `Allow` header, an
/// extractor's plain-text rejection) gets the same JSON body as an [`ApiError`], so every
/// 4xx/5xx of the API carries `detail` and `code`.
pub async fn json_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (mut parts, detail) = match plain_error(next.run(request).await).await {
        Ok(plain) => plain,
        Err(response) => return response,
    };
    let body = json!({ "detail": detail, "code": ErrorCode::for_status(parts.status) });
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, axum::body::Body::from(body.to_string()))
}

/// Middleware around the whole router: its 405 (made JSON by [`json_errors`]) says only
/// "Method Not Allowed"; name the method, the route and the methods it has, so
/// `GET /v1/execute` says to POST instead. The router adds the `Allow` header these come
/// from only after the layers of its routes have run, hence a layer outside it.
pub async fn name_allowed_methods(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let Some(allow) = response.headers().get(header::ALLOW).cloned() else {
        return response;
    };
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FOREIGN_ERROR_BODY).await else {
        return Response::from_parts(parts, axum::body::Body::empty());
    };
    let mut value: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(value) => value,
        Err(_) => return Response::from_parts(parts, axum::body::Body::from(bytes)),
    };
    if value["code"] != ErrorCode::MethodNotAllowed.as_str() {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    value["detail"] = method_not_allowed_detail(&method, &path, Some(&allow)).into();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(value.to_string()))
}

fn method_not_allowed_detail(
    method: &axum::http::Method,
    path: &str,
    allow: Option<&HeaderValue>,
) -> String {
    let allowed: Vec<&str> = allow
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty() && *m != "HEAD")
        .collect();
    match allowed.as_slice() {
        [] => format!("{method} is not allowed on {path}"),
        [one] => format!("{method} is not allowed on {path}; use {one}"),
        many => format!(
            "{method} is not allowed on {path}; use one of {}",
            many.join(", ")
        ),
    }
}
