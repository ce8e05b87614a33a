//! `ApiError`: every failure the API reports, with its status and a stable `detail`.
//! Internal errors are logged and answered with a generic message, never their text.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::files::StoreError;
use crate::files::workspace::StageError;
use crate::pool::PoolError;
use crate::sessions::SessionError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// No API key, or one that is not configured (401 with `WWW-Authenticate: Bearer`).
    #[error("{}", unauthorized_detail(*.invalid_key))]
    Unauthorized { invalid_key: bool },
    /// A limit of the caller's API key (concurrency, sessions, storage).
    #[error("{detail}")]
    TenantLimit {
        detail: String,
        retry_after_secs: u64,
    },
    #[error("{0}")]
    Validation(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    NotImplemented(String),
    #[error("all workers are busy and the wait queue is full; retry later")]
    QueueFull { retry_after_secs: u64 },
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("internal error")]
    Internal(String),
}

fn unauthorized_detail(invalid_key: bool) -> &'static str {
    if invalid_key {
        "the API key is not valid"
    } else {
        "an API key is required: send `Authorization: Bearer <key>`"
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::TenantLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Gone(_) => StatusCode::GONE,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl ApiError {
    /// Whether this is load shedding (429, 503): the request was turned away, not failed.
    pub fn is_shed(&self) -> bool {
        matches!(self, ApiError::QueueFull { .. } | ApiError::Unavailable(_))
    }
}

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::QueueFull => ApiError::QueueFull {
                retry_after_secs: 1,
            },
            PoolError::QueueTimeout(waited) => ApiError::Unavailable(format!(
                "no worker became free within {} ms; the service is overloaded, retry later",
                waited.as_millis()
            )),
            PoolError::ShuttingDown => ApiError::Unavailable("the service is shutting down".into()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        match e {
            e @ SessionError::NotFound(_) => ApiError::NotFound(e.to_string()),
            e @ SessionError::Gone { .. } => ApiError::Gone(e.to_string()),
            e @ SessionError::Busy(_) => ApiError::Conflict(e.to_string()),
            e @ SessionError::Full(_) => ApiError::Unavailable(e.to_string()),
            e @ SessionError::TenantLimit { .. } => ApiError::TenantLimit {
                detail: e.to_string(),
                retry_after_secs: 1,
            },
            SessionError::Pool(e) => e.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => {
                ApiError::NotFound(format!("File with ID '{id}' not found"))
            }
            StoreError::TooLarge { max_bytes } => ApiError::PayloadTooLarge(format!(
                "File size exceeds maximum of {} MB",
                max_bytes >> 20
            )),
            StoreError::QuotaExceeded { quota_bytes } => ApiError::InsufficientStorage(format!(
                "File storage is full (quota of {} MB); delete files you no longer need and retry",
                quota_bytes >> 20
            )),
            StoreError::OwnerQuotaExceeded { owner, quota_bytes } => ApiError::TenantLimit {
                detail: format!(
                    "API key '{owner}' has used up its storage quota of {} MB (max_stored_mb); delete files you no longer need and retry",
                    quota_bytes >> 20
                ),
                retry_after_secs: 60,
            },
            StoreError::Source(e) => {
                ApiError::BadRequest(format!("reading the upload failed: {e}"))
            }
            e @ StoreError::Unavailable { .. } => {
                ApiError::Unavailable(format!("{e}; retry later"))
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<StageError> for ApiError {
    fn from(e: StageError) -> Self {
        match e {
            e @ StageError::NotFound { .. } => ApiError::NotFound(e.to_string()),
            e @ StageError::Conflict { .. } => ApiError::Validation(e.to_string()),
            StageError::Store { source, .. } => source.into(),
            e @ StageError::Io { .. } => ApiError::Internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(%cause, "internal error");
        }
        let mut response = (status, Json(json!({ "detail": self.to_string() }))).into_response();
        match self {
            ApiError::QueueFull { retry_after_secs }
            | ApiError::TenantLimit {
                retry_after_secs, ..
            } => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
            }
            ApiError::Unauthorized { invalid_key } => {
                let challenge = if invalid_key {
                    "Bearer error=\"invalid_token\""
                } else {
                    "Bearer"
                };
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(challenge),
                );
            }
            _ => {}
        }
        response
    }
}
