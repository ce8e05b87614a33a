//! `ApiJson<T>`: axum's JSON extractor with its rejections turned into [`ApiError`]s, so a
//! malformed body gets a `detail` that says what to fix.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(rejection_to_error(rejection)),
        }
    }
}

fn rejection_to_error(rejection: JsonRejection) -> ApiError {
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
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::PayloadTooLarge("request body exceeds the configured maximum size".into())
        }
        other => ApiError::BadRequest(other.body_text()),
    }
}
