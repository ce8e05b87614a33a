//! What agents ask before they run code: `GET /v1/packages` and `GET /v1/tools`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::Value;

use super::SharedState;
use crate::error::ApiError;
use crate::packages::Packages;
use crate::tools::{self, ToolFormat};

pub async fn packages(State(state): State<SharedState>) -> Json<Packages> {
    Json((*state.packages()).clone())
}

#[derive(Debug, Deserialize)]
pub struct ToolsQuery {
    #[serde(default)]
    format: ToolFormat,
}

/// The tool definitions, ready to pass as a model call's `tools`.
/// Their descriptions name the host tools this caller's code may call (Code Mode).
pub async fn tools(
    State(state): State<SharedState>,
    caller: crate::auth::Caller,
    query: Result<Query<ToolsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; format is `openai` (the default) or `anthropic`",
            e.body_text()
        ))
    })?;
    let ctx = state.tool_context_for(caller.owner());
    Ok(Json(tools::render(&tools::catalog(&ctx), q.format)))
}
