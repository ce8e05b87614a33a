//! Request bodies are read as sent: one with a `Content-Encoding` other than `identity`
//! (a client that gzips its JSON) is refused with 415 naming the coding, instead of being
//! parsed as if plain and failing as "not valid JSON".

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Middleware: 415 with `Accept-Encoding: identity` (RFC 9110, 15.5.16) for a request whose
/// body has a content coding.
pub async fn refuse_encoded_bodies(request: Request, next: Next) -> Response {
    let Some(coding) = content_coding(request.headers()) else {
        return next.run(request).await;
    };
    let mut response = ApiError::UnsupportedMediaType(format!(
        "request bodies are read uncompressed; this one has Content-Encoding {coding:?}: send \
         it without compression (and without the Content-Encoding header)"
    ))
    .into_response();
    response.headers_mut().insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    response
}

/// The request's content codings other than `identity`, as sent; `None` when it has none.
fn content_coding(headers: &axum::http::HeaderMap) -> Option<String> {
    let codings: Vec<String> = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|value| {
            String::from_utf8_lossy(value.as_bytes())
                .split(',')
                .map(|c| c.trim().to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
        .collect();
    (!codings.is_empty()).then(|| codings.join(", "))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderMap;

    fn codings(values: &[&str]) -> Option<String> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("content-encoding", v.parse().unwrap());
        }
        super::content_coding(&headers)
    }

    #[test]
    fn identity_or_nothing_passes_and_any_other_coding_is_named() {
        assert_eq!(codings(&[]), None);
        assert_eq!(codings(&["identity"]), None);
        assert_eq!(codings(&["Identity", ""]), None);
        assert_eq!(codings(&["gzip"]).as_deref(), Some("gzip"));
        assert_eq!(codings(&["identity, br"]).as_deref(), Some("br"));
        assert_eq!(
            codings(&["gzip", "deflate"]).as_deref(),
            Some("gzip, deflate")
        );
    }
}
