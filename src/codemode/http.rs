//! `[[tools.http]]`: a tool call becomes one request to the configured URL and nothing
//! else. GET sends the arguments as query parameters, other methods as a JSON body.
//! Redirects are followed only to the same scheme, host and port (at most 5); the body
//! is read up to the result limit and no further, and decoded by the charset its
//! Content-Type declares (UTF-8 when it declares none). A 2xx answer is the result (JSON,
//! or the text as a string); any other status is a `ToolError` carrying the body as data.

use std::borrow::Cow;
use std::time::Duration;

use encoding_rs::{Encoding, UTF_8};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::redirect::{Attempt, Policy};
use serde_json::Value;
use snakecage_worker::jsondepth;
use snakecage_worker::protocol::{ToolErrorKind, ToolOutcome};

use super::catalog::failed;
use super::tls::TrustRoots;
use crate::config::HttpToolConfig;

/// How many redirects (to the same origin) one call follows.
const MAX_REDIRECTS: usize = 5;

pub struct HttpTool {
    name: String,
    url: reqwest::Url,
    method: reqwest::Method,
    client: reqwest::Client,
}

impl HttpTool {
    /// Reads the secrets from the environment now: a missing one fails start-up.
    pub fn new(config: &HttpToolConfig, roots: &TrustRoots) -> Result<Self, String> {
        let url = reqwest::Url::parse(&config.url).map_err(|e| format!("url: {e}"))?;
        let method = reqwest::Method::from_bytes(config.method.as_bytes())
            .map_err(|_| format!("method {:?} is not an HTTP method", config.method))?;
        let mut headers = HeaderMap::new();
        let mut add = |name: &str, value: String| -> Result<(), String> {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header name {name:?} is not valid"))?;
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| format!("the value of header {name} is not valid"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
            Ok(())
        };
        for (name, value) in &config.headers {
            add(name, value.clone())?;
        }
        for (name, var) in &config.headers_from_env {
            let value = std::env::var(var)
                .map_err(|_| format!("environment variable {var} (header {name}) is not set"))?;
            add(name, value)?;
        }
        let client = roots
            .apply(reqwest::Client::builder())
            .default_headers(headers)
            .redirect(Policy::custom(same_origin_only))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Self {
            name: config.name.clone(),
            url,
            method,
            client,
        })
    }

    pub async fn call(&self, arguments: Value, max_result_bytes: usize) -> ToolOutcome {
        let mut request = self.client.request(self.method.clone(), self.url.clone());
        request = if self.method == reqwest::Method::GET {
            request.query(&query_pairs(&arguments))
        } else {
            request.json(&arguments)
        };
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                return ToolOutcome::error(
                    ToolErrorKind::Unavailable,
                    format!(
                        "tool '{}': the request failed: {}",
                        self.name,
                        without_url(&e)
                    ),
                );
            }
        };
        let status = response.status();
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        let body = match read_capped(response, max_result_bytes).await {
            Ok(body) => body,
            Err(outcome) => return outcome,
        };
        // Decoded, a body may be larger than it was (up to three times, from UTF-16): the
        // result is held to the limit again with every provider's.
        let text = decode(&body, content_type.as_ref());
        // JSON too deep to parse is refused here; parsed, it is held to the depth limit
        // with every other result.
        let value = match jsondepth::parse_result(text.as_bytes()) {
            Ok(Some(v)) => v,
            Ok(None) => Value::String(text.into_owned()),
            Err(depth) => {
                return ToolOutcome::error(
                    ToolErrorKind::Limit,
                    jsondepth::too_deep("the tool's result", depth),
                );
            }
        };
        if status.is_success() {
            ToolOutcome::Ok { result: value }
        } else {
            failed(
                format!("tool '{}' answered HTTP {status}", self.name),
                value,
            )
        }
    }
}

/// `body` as text, decoded by the charset `content_type` declares, or as UTF-8 when it
/// declares none or one unknown (what reqwest's `Response::text` does, on a body already
/// read within the limit). A byte-order mark overrides the declaration; bytes the
/// encoding cannot decode become U+FFFD.
fn decode<'a>(body: &'a [u8], content_type: Option<&HeaderValue>) -> Cow<'a, str> {
    let charset = content_type
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<mime::Mime>().ok())
        .and_then(|mime| {
            mime.get_param(mime::CHARSET)
                .and_then(|charset| Encoding::for_label(charset.as_str().as_bytes()))
        });
    charset.unwrap_or(UTF_8).decode(body).0
}

/// Scalars as they are, anything else as its JSON text.
fn query_pairs(arguments: &Value) -> Vec<(String, String)> {
    let Some(object) = arguments.as_object() else {
        return Vec::new();
    };
    object
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), text)
        })
        .collect()
}

/// The error without the URL (which may carry a token in its query).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.without_url_ref().to_string();
    if e.is_timeout() {
        text.push_str(" (timed out)");
    }
    text
}

trait WithoutUrl {
    fn without_url_ref(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    fn without_url_ref(&self) -> String {
        let mut source: Option<&dyn std::error::Error> = Some(self);
        let mut last = String::new();
        while let Some(e) = source {
            last = e.to_string();
            source = e.source();
        }
        if self.is_connect() {
            format!("could not connect: {last}")
        } else {
            last
        }
    }
}

async fn read_capped(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, ToolOutcome> {
    let too_big = || {
        ToolOutcome::error(
            ToolErrorKind::Limit,
            format!(
                "the tool's response is larger than the {max} bytes allowed (tools.max_result_bytes)"
            ),
        )
    };
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max {
                    return Err(too_big());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                return Err(ToolOutcome::error(
                    ToolErrorKind::Unavailable,
                    format!(
                        "reading the tool's response failed: {}",
                        e.without_url_ref()
                    ),
                ));
            }
        }
    }
}

fn same_origin_only(attempt: Attempt<'_>) -> reqwest::redirect::Action {
    let first = attempt.previous().first();
    let same = first.is_some_and(|first| {
        first.scheme() == attempt.url().scheme()
            && first.host_str() == attempt.url().host_str()
            && first.port_or_known_default() == attempt.url().port_or_known_default()
    });
    if same && attempt.previous().len() <= MAX_REDIRECTS {
        attempt.follow()
    } else {
        attempt.stop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_body_is_decoded_by_its_declared_charset_and_else_as_utf8() {
        let latin1 = HeaderValue::from_static("application/json; charset=ISO-8859-1");
        assert_eq!(decode(b"\"caf\xe9\"", Some(&latin1)), "\"café\"");
        let quoted = HeaderValue::from_static("text/plain; charset=\"windows-1252\"");
        assert_eq!(decode(b"2 \x80", Some(&quoted)), "2 €");
        let utf16 = HeaderValue::from_static("text/plain; charset=utf-16le");
        assert_eq!(decode(b"h\0\xe9\0", Some(&utf16)), "hé");
        // None, or one unknown: UTF-8, invalid bytes replaced.
        let unknown = HeaderValue::from_static("text/plain; charset=no-such-thing");
        assert_eq!(decode("é".as_bytes(), Some(&unknown)), "é");
        assert_eq!(decode(b"caf\xe9", None), "caf\u{fffd}");
    }

    #[test]
    fn get_arguments_become_query_parameters() {
        let pairs = query_pairs(&json!({"city": "Zürich", "days": 3, "tags": ["a"], "x": null}));
        assert_eq!(
            pairs,
            [
                ("city".to_owned(), "Zürich".to_owned()),
                ("days".to_owned(), "3".to_owned()),
                ("tags".to_owned(), "[\"a\"]".to_owned()),
            ]
        );
    }
}
