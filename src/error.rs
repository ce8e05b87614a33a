//! `ApiError`: every failure the API reports, with its status, a `detail` that says what to
//! fix and a stable machine-readable `code` ([`ErrorCode`], decided here and nowhere else).
//! Internal errors are logged and answered with a generic message, never their text.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::envs::EnvError;
use crate::envs::bytecode::BytecodeError;
use crate::envs::spec::SpecError;
use crate::envs::uv::UvError;
use crate::files::workspace::StageError;
use crate::files::{DELETE_AND_RETRY, QuotaWords, StoreError, over_quota_detail, size_text};
use crate::pool::PoolError;
use crate::sessions::SessionError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// No API key, one that is not configured, or an `Authorization` header that holds
    /// none (401 with `WWW-Authenticate: Bearer`).
    #[error("{}", unauthorized_detail(*.0))]
    Unauthorized(KeyProblem),
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
    /// A download's `Range` that selects no byte of the file (416 with
    /// `Content-Range: bytes */size`).
    #[error("{}", range_not_satisfiable_detail(*.size))]
    RangeNotSatisfiable { size: u64 },
    /// `timeout_ms` over `limits.max_timeout_ms`.
    #[error("timeout_ms exceeds maximum of {max_ms} ms")]
    TimeoutTooLarge { max_ms: u64 },
    /// No route (or another unknown thing that is neither a file nor a session).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FileNotFound(String),
    #[error("{0}")]
    SessionNotFound(String),
    /// A session busy with another request.
    #[error("{0}")]
    SessionBusy(String),
    /// An answer to a tool call its run is not waiting for (answered already, never made).
    #[error("{0}")]
    ToolCallNotWaiting(String),
    /// An answer to a tool call that was cancelled before it came; `detail` says why.
    #[error("{0}")]
    ToolCallCancelled(String),
    /// A session that ended on its own (expired, evicted, lost, failed replay).
    #[error("{0}")]
    Gone(String),
    /// A run whose replica is gone (killed, scaled down, restarted): it ended with it.
    #[error("{0}")]
    RunGone(String),
    #[error("{0}")]
    NotImplemented(String),
    #[error("all workers are busy and the wait queue is full; retry later")]
    QueueFull { retry_after_secs: u64 },
    #[error("{0}")]
    Unavailable(String),
    /// The service cannot take requests yet, or no longer (`/ready`).
    #[error("{0}")]
    NotReady(String),
    #[error("{0}")]
    InsufficientStorage(String),
    /// A valid key that may not use this route (an admin route without the admin scope).
    #[error("{0}")]
    Forbidden(String),
    /// Another rollover (reload, package change) is in progress.
    #[error("{0}")]
    RolloverBusy(String),
    /// A new generation failed to start or its probe failed; the old one keeps serving.
    #[error("{0}")]
    RolloverFailed(String),
    /// The package installer could not satisfy an operator's request (it does not resolve,
    /// a build failed): `detail` is the installer's own text.
    #[error("{0}")]
    InstallFailed(String),
    /// The package index could not be reached (the installer's text).
    #[error("{0}")]
    IndexUnreachable(String),
    #[error("internal error")]
    Internal(String),
}

fn range_not_satisfiable_detail(size: u64) -> String {
    if size == 0 {
        return "the Range asks for bytes of an empty file (0 bytes); leave Range out to \
                download it"
            .into();
    }
    format!(
        "the Range asks for no byte of the file, which is {size} bytes long: a range must \
         start below {size} (bytes=0-{last} is all of it); leave Range out for the whole file",
        last = size - 1
    )
}

/// Why a request's key was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyProblem {
    /// No `Authorization` header.
    Missing,
    /// A header that is not `Bearer <key>` (another scheme, no space, nothing after it).
    NotBearer,
    /// A header with bytes that are not visible ASCII: no key has them.
    NotAscii,
    /// A well-formed key that is not configured.
    Invalid,
}

fn unauthorized_detail(problem: KeyProblem) -> &'static str {
    match problem {
        KeyProblem::Missing => "an API key is required: send `Authorization: Bearer <key>`",
        KeyProblem::NotBearer => {
            "the Authorization header is not `Bearer <key>`: send the key after the word \
             `Bearer` and one space"
        }
        KeyProblem::NotAscii => {
            "the Authorization header holds characters that are not visible ASCII, which no \
             API key has (`snakecage keys add` makes keys of `sc_` and 64 hexadecimal \
             digits): send `Authorization: Bearer <key>`"
        }
        KeyProblem::Invalid => "the API key is not valid",
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
            ApiError::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            ApiError::TimeoutTooLarge { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) | ApiError::FileNotFound(_) | ApiError::SessionNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            ApiError::SessionBusy(_) | ApiError::ToolCallNotWaiting(_) => StatusCode::CONFLICT,
            ApiError::Gone(_) | ApiError::RunGone(_) | ApiError::ToolCallCancelled(_) => {
                StatusCode::GONE
            }
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::RolloverBusy(_) => StatusCode::CONFLICT,
            ApiError::RolloverFailed(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::InstallFailed(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::IndexUnreachable(_) => StatusCode::BAD_GATEWAY,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl ApiError {
    /// The stable code a client maps. The match is exhaustive on purpose: a new variant
    /// cannot compile without choosing its code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::BadRequest(_) => ErrorCode::BadRequest,
            ApiError::Unauthorized { .. } => ErrorCode::Unauthorized,
            ApiError::TenantLimit { .. } => ErrorCode::TenantLimit,
            ApiError::Validation(_) => ErrorCode::InvalidRequest,
            ApiError::TimeoutTooLarge { .. } => ErrorCode::TimeoutTooLarge,
            ApiError::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            ApiError::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            ApiError::RangeNotSatisfiable { .. } => ErrorCode::RangeNotSatisfiable,
            ApiError::NotFound(_) => ErrorCode::NotFound,
            ApiError::FileNotFound(_) => ErrorCode::FileNotFound,
            ApiError::SessionNotFound(_) => ErrorCode::SessionNotFound,
            ApiError::SessionBusy(_) => ErrorCode::SessionBusy,
            ApiError::ToolCallNotWaiting(_) => ErrorCode::ToolCallNotWaiting,
            ApiError::ToolCallCancelled(_) => ErrorCode::ToolCallCancelled,
            ApiError::Gone(_) => ErrorCode::SessionGone,
            ApiError::RunGone(_) => ErrorCode::RunGone,
            ApiError::NotImplemented(_) => ErrorCode::NotImplemented,
            ApiError::QueueFull { .. } => ErrorCode::QueueFull,
            ApiError::Unavailable(_) => ErrorCode::Unavailable,
            ApiError::NotReady(_) => ErrorCode::NotReady,
            ApiError::InsufficientStorage(_) => ErrorCode::InsufficientStorage,
            ApiError::Forbidden(_) => ErrorCode::Forbidden,
            ApiError::RolloverBusy(_) => ErrorCode::RolloverInProgress,
            ApiError::RolloverFailed(_) => ErrorCode::RolloverFailed,
            ApiError::InstallFailed(_) => ErrorCode::InstallFailed,
            ApiError::IndexUnreachable(_) => ErrorCode::IndexUnreachable,
            ApiError::Internal(_) => ErrorCode::InternalError,
        }
    }

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
            e @ (PoolError::NoWorkers(_) | PoolError::Unavailable(_)) => {
                ApiError::Unavailable(format!("{e}; retry later"))
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        match e {
            e @ SessionError::NotFound(_) => ApiError::SessionNotFound(e.to_string()),
            e @ SessionError::Gone { .. } => ApiError::Gone(e.to_string()),
            e @ SessionError::Busy(_) => ApiError::SessionBusy(e.to_string()),
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
                ApiError::FileNotFound(format!("File with ID '{id}' not found"))
            }
            StoreError::TooLarge { max_bytes } => ApiError::PayloadTooLarge(format!(
                "File size exceeds maximum of {} MB",
                max_bytes >> 20
            )),
            StoreError::QuotaExceeded {
                quota_bytes,
                stored_bytes,
                upload,
                charge,
                holders,
            } => {
                let remedy = match holders {
                    None => DELETE_AND_RETRY.to_owned(),
                    Some(h) if h.caller_rank.is_some() => {
                        format!("{}; {DELETE_AND_RETRY}", h.describe())
                    }
                    Some(h) => format!(
                        "{}; retry once files expire or an operator makes room",
                        h.describe()
                    ),
                };
                quota_refusal(
                    &QuotaWords {
                        whose: "file storage",
                        quota: &format!("its quota of {} (files.quota_mb)", size_text(quota_bytes)),
                        quota_bytes,
                        stored_bytes,
                        upload,
                        charge,
                        remedy: &remedy,
                    },
                    ApiError::InsufficientStorage,
                )
            }
            StoreError::OwnerQuotaExceeded {
                owner,
                quota_bytes,
                stored_bytes,
                upload,
                charge,
                own,
            } => quota_refusal(
                &QuotaWords {
                    whose: &format!("API key '{owner}'"),
                    quota: &if own {
                        format!("its own quota of {} (max_stored_mb)", size_text(quota_bytes))
                    } else {
                        format!(
                            "its own share of the store, {} (files.key_share_percent of \
                             files.quota_mb, for a key without max_stored_mb)",
                            size_text(quota_bytes)
                        )
                    },
                    quota_bytes,
                    stored_bytes,
                    upload,
                    charge,
                    remedy: DELETE_AND_RETRY,
                },
                |detail| ApiError::TenantLimit {
                    detail,
                    retry_after_secs: 60,
                },
            ),
            StoreError::TooManyFiles {
                owner: Some(owner),
                max_files,
            } => ApiError::TenantLimit {
                detail: format!(
                    "API key '{owner}' holds {max_files} files, the most a key may hold \
                     (files.max_files_per_key); {DELETE_AND_RETRY}"
                ),
                retry_after_secs: 60,
            },
            StoreError::TooManyFiles {
                owner: None,
                max_files,
            } => ApiError::InsufficientStorage(format!(
                "The file store holds {max_files} files, the most it may hold \
                 (files.max_files); {DELETE_AND_RETRY}"
            )),
            e if e.is_out_of_space() => ApiError::InsufficientStorage(
                "The file store has no space left (its disk is full or read-only); stored files are unaffected. Retry later".into(),
            ),
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

/// A quota's refusal of a file (in the words of [`over_quota_detail`]): one larger than
/// the whole quota is too large (413), now and after any wait, so nothing says to retry;
/// one that only does not fit beside what is stored is `fits_later`'s (the store's 507,
/// the API key's 429), which deletions lift.
fn quota_refusal(words: &QuotaWords<'_>, fits_later: impl FnOnce(String) -> ApiError) -> ApiError {
    let detail = over_quota_detail(words);
    if words.upload.larger_than(words.quota_bytes, words.charge) {
        ApiError::PayloadTooLarge(detail)
    } else {
        fits_later(detail)
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        ApiError::Validation(e.to_string())
    }
}

impl From<EnvError> for ApiError {
    fn from(e: EnvError) -> Self {
        match e {
            e @ (EnvError::Spec(_) | EnvError::Plan(_) | EnvError::MarkerExcludes { .. }) => {
                ApiError::Validation(e.to_string())
            }
            e @ EnvError::Busy => ApiError::RolloverBusy(e.to_string()),
            e @ EnvError::NoBaseVenv => ApiError::Unavailable(e.to_string()),
            EnvError::Uv(e) => match e {
                e @ UvError::Missing(_) => ApiError::Unavailable(e.to_string()),
                UvError::Unresolvable(text) | UvError::Failed(text) => {
                    ApiError::InstallFailed(text)
                }
                UvError::IndexUnreachable(text) => ApiError::IndexUnreachable(text),
                e @ UvError::TimedOut(_) => ApiError::Unavailable(format!(
                    "the install {e} (packages.install_timeout_seconds); nothing changed"
                )),
                e @ UvError::Spawn { .. } => ApiError::Internal(e.to_string()),
            },
            EnvError::Bytecode(e) => match e {
                e @ BytecodeError::Failed(_) => ApiError::InstallFailed(e.to_string()),
                e @ BytecodeError::TimedOut(_) => ApiError::Unavailable(format!(
                    "{e} (packages.install_timeout_seconds); nothing changed"
                )),
                e @ BytecodeError::Spawn { .. } => ApiError::Internal(e.to_string()),
            },
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<StageError> for ApiError {
    fn from(e: StageError) -> Self {
        match e {
            e @ StageError::NotFound { .. } => ApiError::FileNotFound(e.to_string()),
            e @ StageError::Conflict { .. } => ApiError::Validation(e.to_string()),
            e @ StageError::NameTooLong { .. } => ApiError::Validation(e.to_string()),
            e @ StageError::NoSpace { .. } => ApiError::Unavailable(e.to_string()),
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
        let body = json!({ "detail": self.to_string(), "code": self.code() });
        let mut response = (status, Json(body)).into_response();
        match self {
            ApiError::QueueFull { retry_after_secs }
            | ApiError::TenantLimit {
                retry_after_secs, ..
            } => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
            }
            // Overloaded, degraded, starting or stopping: worth retrying soon (or elsewhere).
            ApiError::Unavailable(_) | ApiError::NotReady(_) => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            }
            ApiError::RangeNotSatisfiable { size } => {
                response.headers_mut().insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{size}"))
                        .expect("a number is a header value"),
                );
            }
            ApiError::Unauthorized(problem) => {
                // RFC 6750: no error code for a request without credentials.
                let challenge = match problem {
                    KeyProblem::Missing => "Bearer",
                    KeyProblem::NotBearer | KeyProblem::NotAscii => {
                        "Bearer error=\"invalid_request\""
                    }
                    KeyProblem::Invalid => "Bearer error=\"invalid_token\"",
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

/// The stable `code` of an error body. Each is documented in README.md's table of error
/// codes (a test keeps the two in step); a client maps these, never the `detail` prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    InvalidRequest,
    TimeoutTooLarge,
    Unauthorized,
    NotFound,
    FileNotFound,
    SessionNotFound,
    MethodNotAllowed,
    SessionBusy,
    SessionGone,
    RunGone,
    PayloadTooLarge,
    UnsupportedMediaType,
    RangeNotSatisfiable,
    NotAcceptable,
    TenantLimit,
    QueueFull,
    InternalError,
    NotImplemented,
    Unavailable,
    NotReady,
    InsufficientStorage,
    Forbidden,
    RolloverInProgress,
    RolloverFailed,
    InstallFailed,
    IndexUnreachable,
    ToolCallNotWaiting,
    ToolCallCancelled,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 29] = [
        ErrorCode::BadRequest,
        ErrorCode::InvalidRequest,
        ErrorCode::TimeoutTooLarge,
        ErrorCode::Unauthorized,
        ErrorCode::NotFound,
        ErrorCode::FileNotFound,
        ErrorCode::SessionNotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::SessionBusy,
        ErrorCode::SessionGone,
        ErrorCode::RunGone,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::RangeNotSatisfiable,
        ErrorCode::NotAcceptable,
        ErrorCode::TenantLimit,
        ErrorCode::QueueFull,
        ErrorCode::InternalError,
        ErrorCode::NotImplemented,
        ErrorCode::Unavailable,
        ErrorCode::NotReady,
        ErrorCode::InsufficientStorage,
        ErrorCode::Forbidden,
        ErrorCode::RolloverInProgress,
        ErrorCode::RolloverFailed,
        ErrorCode::InstallFailed,
        ErrorCode::IndexUnreachable,
        ErrorCode::ToolCallNotWaiting,
        ErrorCode::ToolCallCancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::TimeoutTooLarge => "timeout_too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::FileNotFound => "file_not_found",
            ErrorCode::SessionNotFound => "session_not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::SessionBusy => "session_busy",
            ErrorCode::SessionGone => "session_gone",
            ErrorCode::RunGone => "run_gone",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::RangeNotSatisfiable => "range_not_satisfiable",
            ErrorCode::NotAcceptable => "not_acceptable",
            ErrorCode::TenantLimit => "tenant_limit",
            ErrorCode::QueueFull => "queue_full",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::NotImplemented => "not_implemented",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::RolloverInProgress => "rollover_in_progress",
            ErrorCode::RolloverFailed => "rollover_failed",
            ErrorCode::InstallFailed => "install_failed",
            ErrorCode::IndexUnreachable => "index_unreachable",
            ErrorCode::ToolCallNotWaiting => "tool_call_not_waiting",
            ErrorCode::ToolCallCancelled => "tool_call_cancelled",
        }
    }

    /// The code of an error answered by a layer below the handlers (the router's 405, an
    /// extractor's own rejection): by its status alone.
    pub fn for_status(status: StatusCode) -> ErrorCode {
        match status {
            StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
            StatusCode::FORBIDDEN => ErrorCode::Forbidden,
            StatusCode::NOT_FOUND => ErrorCode::NotFound,
            StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
            StatusCode::NOT_ACCEPTABLE => ErrorCode::NotAcceptable,
            StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::InvalidRequest,
            StatusCode::TOO_MANY_REQUESTS => ErrorCode::QueueFull,
            StatusCode::SERVICE_UNAVAILABLE => ErrorCode::Unavailable,
            StatusCode::INSUFFICIENT_STORAGE => ErrorCode::InsufficientStorage,
            s if s.is_server_error() => ErrorCode::InternalError,
            _ => ErrorCode::BadRequest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes in README.md's table of error codes, in its order.
    fn documented_codes() -> Vec<String> {
        let readme = include_str!("../README.md");
        let table = readme
            .split("<!-- error-codes -->")
            .nth(1)
            .expect("README.md has an <!-- error-codes --> table");
        table
            .lines()
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_code_is_documented_in_the_readme_table_and_nothing_else_is() {
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(documented_codes(), codes);
        for code in ErrorCode::ALL {
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                serde_json::Value::from(code.as_str())
            );
        }
    }

    #[test]
    fn a_code_comes_with_every_error_and_the_status_it_documents() {
        let readme = include_str!("../README.md");
        for (error, code, status) in [
            (ApiError::Validation("x".into()), "invalid_request", 422),
            (
                ApiError::TimeoutTooLarge { max_ms: 5 },
                "timeout_too_large",
                422,
            ),
            (ApiError::FileNotFound("x".into()), "file_not_found", 404),
            (
                ApiError::RangeNotSatisfiable { size: 7 },
                "range_not_satisfiable",
                416,
            ),
            (ApiError::Gone("x".into()), "session_gone", 410),
            (ApiError::SessionBusy("x".into()), "session_busy", 409),
            (
                ApiError::ToolCallNotWaiting("x".into()),
                "tool_call_not_waiting",
                409,
            ),
            (ApiError::RunGone("x".into()), "run_gone", 410),
            (
                ApiError::ToolCallCancelled("x".into()),
                "tool_call_cancelled",
                410,
            ),
            (
                ApiError::QueueFull {
                    retry_after_secs: 1,
                },
                "queue_full",
                429,
            ),
            (ApiError::NotReady("x".into()), "not_ready", 503),
            (ApiError::Internal("secret".into()), "internal_error", 500),
        ] {
            assert_eq!(error.code().as_str(), code);
            assert_eq!(error.status().as_u16(), status);
            let row = format!("| `{code}` | {status} |");
            assert!(readme.contains(&row), "README lacks the row {row}");
        }
    }

    /// A file larger than a whole quota is 413 with nothing to retry after; one that only
    /// does not fit beside what is stored stays the store's 507 or the key's 429 (with
    /// `Retry-After`). The detail is the quota's own either way.
    #[test]
    fn a_file_larger_than_a_whole_quota_is_too_large_not_a_limit_to_wait_out() {
        use crate::files::UploadSize;
        let charge = crate::files::Charge::default();
        let key = |upload| StoreError::OwnerQuotaExceeded {
            owner: "bob".into(),
            quota_bytes: 1 << 20,
            stored_bytes: 700 << 10,
            upload,
            charge,
            own: true,
        };
        let store = |upload| StoreError::QuotaExceeded {
            quota_bytes: 1 << 20,
            stored_bytes: 700 << 10,
            upload,
            charge,
            holders: None,
        };
        for (error, status, retry_after) in [
            (key(UploadSize::Whole(2 << 20)), 413, None),
            (key(UploadSize::AtLeast((1 << 20) + 1)), 413, None),
            (key(UploadSize::Whole(700 << 10)), 429, Some("60")),
            (key(UploadSize::AtLeast(400 << 10)), 429, Some("60")),
            (store(UploadSize::Whole(2 << 20)), 413, None),
            (store(UploadSize::AtLeast((1 << 20) + 1)), 413, None),
            // Only its charge (one block more) is larger than the quota.
            (store(UploadSize::Whole(1 << 20)), 413, None),
            (store(UploadSize::Whole((1 << 20) - 4096)), 507, None),
        ] {
            let error = ApiError::from(error);
            let detail = error.to_string();
            let response = error.into_response();
            assert_eq!(response.status().as_u16(), status, "{detail}");
            assert_eq!(
                response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .map(|v| v.to_str().unwrap()),
                retry_after,
                "{detail}"
            );
            assert!(detail.starts_with("This file would take "), "{detail}");
            assert_eq!(
                detail.contains("larger than the whole quota"),
                status == 413,
                "{detail}"
            );
        }
    }

    /// A key's own quota says it is its own; its default share says so and where it comes
    /// from; a full store tells a key how it compares and names no other key; file counts
    /// are the key's 429 or the store's 507.
    #[test]
    fn store_refusals_say_whose_bound_it_is() {
        use crate::files::{Charge, Holders, UploadSize};
        let detail = |e: StoreError| {
            let api = ApiError::from(e);
            (api.status().as_u16(), api.to_string())
        };
        let owner = |own| StoreError::OwnerQuotaExceeded {
            owner: "ana".into(),
            quota_bytes: 1 << 20,
            stored_bytes: 1000 << 10,
            upload: UploadSize::Whole(1),
            charge: Charge::default(),
            own,
        };
        assert_eq!(
            detail(owner(true)),
            (
                429,
                "This file would take API key 'ana' past its own quota of 1 MB \
                 (max_stored_mb): 1000 KB is used and the file is 1 bytes, counted as 8 KB; \
                 delete files you no longer need and retry"
                    .into()
            )
        );
        assert_eq!(
            detail(owner(false)).1,
            "This file would take API key 'ana' past its own share of the store, 1 MB \
             (files.key_share_percent of files.quota_mb, for a key without max_stored_mb): \
             1000 KB is used and the file is 1 bytes, counted as 8 KB; delete files you no \
             longer need and retry"
        );
        let full = |caller_rank, caller| StoreError::QuotaExceeded {
            quota_bytes: 10 << 20,
            stored_bytes: 10 << 20,
            upload: UploadSize::Whole(100),
            charge: Charge::default(),
            holders: Some(Holders {
                caller,
                caller_rank,
                largest: 6 << 20,
                keys: 3,
            }),
        };
        assert_eq!(
            detail(full(None, 0)),
            (
                507,
                "This file would take file storage past its quota of 10 MB (files.quota_mb): \
                 10 MB is used and the file is 100 bytes, counted as 8 KB; this API key holds \
                 nothing of it; the largest holder, another key, holds 6 MB; retry once files \
                 expire or an operator makes room"
                    .into()
            )
        );
        assert_eq!(
            detail(full(Some(1), 6 << 20)).1,
            "This file would take file storage past its quota of 10 MB (files.quota_mb): 10 MB \
             is used and the file is 100 bytes, counted as 8 KB; this API key holds 6 MB of it, \
             the most of the 3 key(s) holding files; delete files you no longer need and retry"
        );
        assert_eq!(
            detail(StoreError::TooManyFiles {
                owner: Some("ana".into()),
                max_files: 10
            }),
            (
                429,
                "API key 'ana' holds 10 files, the most a key may hold \
                 (files.max_files_per_key); delete files you no longer need and retry"
                    .into()
            )
        );
        assert_eq!(
            detail(StoreError::TooManyFiles {
                owner: None,
                max_files: 10
            })
            .0,
            507
        );
    }
}
