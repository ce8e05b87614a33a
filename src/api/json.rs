//! `ApiJson<T>`: axum's JSON extractor with its rejections turned into [`ApiError`]s, so a
//! malformed body gets a `detail` that says what to fix.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::SharedState;
use crate::error::ApiError;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<SharedState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &SharedState) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(rejection_to_error(rejection, state)),
        }
    }
}

fn rejection_to_error(rejection: JsonRejection, state: &SharedState) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(e) => {
            ApiError::Validation(format!("invalid request body: {}", e.body_text()))
        }
        JsonRejection::JsonSyntaxError(e) => {
            ApiError::BadRequest(format!("request body is not valid JSON: {}", e.body_text()))
        }
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
