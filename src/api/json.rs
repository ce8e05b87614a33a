//! `ApiJson<T>`: a JSON object body, with every way it can be wrong turned into an
//! [`ApiError`] whose `detail` says what to fix (and names the field, or sketches the
//! object its endpoint takes).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::{DeserializeOwned, IgnoredAny};
use snakecage_worker::jsondepth;

use super::SharedState;
use crate::error::ApiError;

pub struct ApiJson<T>(pub T);

/// A request body: a JSON object, sketched for the refusal of JSON of another shape.
pub trait JsonObject: DeserializeOwned {
    /// The object in brief, as a client would start writing it: `{"code": ...}`.
    const SKETCH: &'static str;

    /// The refusal of a body that is JSON nested `depth` levels deep (its own object
    /// included), deeper than serde_json parses; `None`: refused as JSON it cannot read.
    fn too_deep(_depth: usize) -> Option<ApiError> {
        None
    }
}

// Here rather than beside its type: `api/runs.rs` is the tool-call protocol's.
impl JsonObject for super::runs::AnswerBody {
    const SKETCH: &'static str = r#"{"result": ...} or {"error": ...}"#;

    fn too_deep(depth: usize) -> Option<ApiError> {
        Some(super::runs::answer_too_deep(&format!(
            "the answer (its own object included) is nested {depth} levels deep"
        )))
    }
}

impl<T: JsonObject> FromRequest<SharedState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &SharedState) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers().get(header::CONTENT_TYPE)) {
            return Err(ApiError::UnsupportedMediaType(
                "expected a JSON body with Content-Type: application/json".into(),
            ));
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|rejection| bytes_rejection(&rejection, state))?;
        parse_object(&bytes, state).map(ApiJson)
    }
}

/// `application/json`, or a `+json` type, parameters aside (axum's own test).
fn is_json(value: Option<&axum::http::HeaderValue>) -> bool {
    let Some(mime) = value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
    else {
        return false;
    };
    let mime = mime.trim().to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// A body that could not be read: too large (413, saying the limit), or cut off.
pub fn bytes_rejection(rejection: &BytesRejection, state: &SharedState) -> ApiError {
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => body_too_large(state),
        _ => ApiError::BadRequest(rejection.body_text()),
    }
}

/// A request body that must be one JSON object. Not JSON at all is 400; JSON of another
/// shape (an array, which serde would read field by field, a string, a number) or with a
/// wrong field is 422, the field named.
pub fn parse_object<T: JsonObject>(bytes: &[u8], state: &SharedState) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        if let Err(e) = serde_json::from_slice::<IgnoredAny>(bytes) {
            return Err(syntax_error(&e.to_string()));
        }
        let what = match first {
            Some(b'[') => "an array",
            Some(b'"') => "a string",
            Some(b'n') => "null",
            Some(b't' | b'f') => "a boolean",
            _ => "a number",
        };
        return Err(ApiError::Validation(format!(
            "the request body must be a JSON object ({}), not {what}",
            T::SKETCH
        )));
    }
    axum::Json::<T>::from_bytes(bytes)
        .map(|axum::Json(value)| value)
        .map_err(|rejection| match rejection {
            JsonRejection::JsonSyntaxError(_) => jsondepth::parse_result(bytes)
                .err()
                .and_then(T::too_deep)
                .unwrap_or_else(|| rejection_to_error(rejection, state)),
            rejection => rejection_to_error(rejection, state),
        })
}

fn syntax_error(text: &str) -> ApiError {
    let mut detail = format!("request body is not valid JSON: {text}");
    // serde_json: "lone leading surrogate", or, for a leading half followed by anything
    // but its trailing one, "unexpected end of hex escape".
    if text.contains("surrogate") || text.contains("hex escape") {
        // What Python's json.dumps writes for a str holding surrogateescape'd bytes.
        detail.push_str(
            "; strings must be valid Unicode: a lone \\udXXX escape (half of a surrogate \
             pair) cannot be read, replace it (e.g. with U+FFFD) before sending",
        );
    }
    ApiError::BadRequest(detail)
}

fn rejection_to_error(rejection: JsonRejection, state: &SharedState) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(e) => {
            ApiError::Validation(format!("invalid request body: {}", e.body_text()))
        }
        JsonRejection::JsonSyntaxError(e) => syntax_error(&e.body_text()),
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(
            "expected a JSON body with Content-Type: application/json".into(),
        ),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => body_too_large(state),
        other => ApiError::BadRequest(other.body_text()),
    }
}

/// A JSON body over `limits.max_request_bytes`: say the limit, and where large data goes
/// instead (an upload, staged into the run by `file_id`).
pub fn body_too_large(state: &SharedState) -> ApiError {
    let limit = state.config().limits.max_request_bytes;
    ApiError::PayloadTooLarge(format!(
        "the request body is over {limit} bytes (limits.max_request_bytes); upload large data \
         with POST /v1/files and stage it into the run with `files`"
    ))
}

/// What kind of JSON value `value` is, in words for a `detail`: `a string`, `an array`.
pub(crate) fn json_kind(value: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
