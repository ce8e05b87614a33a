//! What agents ask before they run code: `GET /v1/packages` and `GET /v1/tools`.

use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::Value;

use super::SharedState;
use crate::packages::Packages;
use crate::tools::{self, ToolFormat};

pub async fn packages(State(state): State<SharedState>) -> Json<Packages> {
    Json(state.packages.clone())
}

#[derive(Debug, Deserialize)]
pub struct ToolsQuery {
    #[serde(default)]
    format: ToolFormat,
}

/// The tool definitions, ready to pass as a model call's `tools`.
pub async fn tools(State(state): State<SharedState>, Query(q): Query<ToolsQuery>) -> Json<Value> {
    Json(tools::render(
        &tools::catalog(&state.tool_context),
        q.format,
    ))
}
