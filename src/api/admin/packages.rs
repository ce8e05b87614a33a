//! `/v1/admin/packages`: list, add, remove and sync the operator's Python packages. A change
//! builds a new environment generation (`crate::envs`), then rolls the pool over to it
//! (`crate::generation::roll_over`); any failure leaves the serving generation as it was and
//! answers with the installer's (or the probe's) own words. A change that changes nothing
//! (`crate::envs::Prepare::Unchanged`) rolls nothing over and answers `"rolled_over":
//! false` with the serving generation. Admin keys only.

use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::SharedState;
use crate::api::json::ApiJson;
use crate::auth::AdminCaller;
use crate::envs::Prepare;
use crate::envs::plan::Change;
use crate::envs::requirements;
use crate::envs::spec::{Spec, parse_names};
use crate::error::ApiError;
use crate::generation::{NextGeneration, Outcome, RolloverError, roll_over_in};

/// `GET /v1/admin/packages`: the distributions of the serving environment.
pub async fn list(
    State(state): State<SharedState>,
    _admin: AdminCaller,
) -> Result<Json<Value>, ApiError> {
    let live = state.config();
    let listing = state.envs.list(&live)?;
    let mut body = serde_json::to_value(listing).map_err(|e| ApiError::Internal(e.to_string()))?;
    body["requested"] = json!(state.envs.manifest().requested.values().collect::<Vec<_>>());
    body["generation"] = json!(state.generation());
    Ok(Json(body))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddBody {
    /// Requirements: `tabulate`, `tabulate==0.9.0`, `requests[socks]>=2,<3`.
    add: Vec<String>,
    /// Extra constraints for this install.
    #[serde(default)]
    constraints: Vec<String>,
}

impl crate::api::json::JsonObject for AddBody {
    const SKETCH: &'static str = r#"{"add": [...]}"#;
}

/// `POST /v1/admin/packages {"add": [...]}`.
pub async fn add(
    State(state): State<SharedState>,
    _admin: AdminCaller,
    ApiJson(body): ApiJson<AddBody>,
) -> Result<Json<Value>, ApiError> {
    let specs = Spec::parse_all(&body.add)?;
    let constraints = if body.constraints.is_empty() {
        Vec::new()
    } else {
        Spec::parse_all(&body.constraints)?
    };
    apply(state, Change::Add { specs, constraints }).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveBody {
    remove: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    /// Comma-separated distribution names.
    name: Option<String>,
}

/// `DELETE /v1/admin/packages {"remove": [...]}` or `?name=a,b`.
pub async fn remove(
    State(state): State<SharedState>,
    _admin: AdminCaller,
    query: Result<Query<RemoveQuery>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; the only query parameter is `name`",
            e.body_text()
        ))
    })?;
    let raw: Vec<String> = match (query.name, body.is_empty()) {
        (Some(names), true) => names.split(',').map(str::to_owned).collect(),
        (None, false) => {
            serde_json::from_slice::<RemoveBody>(&body)
                .map_err(|e| ApiError::Validation(format!("invalid request body: {e}")))?
                .remove
        }
        (Some(_), false) => {
            return Err(ApiError::Validation(
                "give the names either as ?name= or as {\"remove\": [...]}, not both".into(),
            ));
        }
        (None, true) => {
            return Err(ApiError::Validation(
                "give the distributions to remove: {\"remove\": [\"tabulate\"]} or ?name=tabulate"
                    .into(),
            ));
        }
    };
    let names = parse_names(&raw)?;
    apply(state, Change::Remove { names }).await
}

/// `POST /v1/admin/packages/sync` with a requirements.txt body: the added set becomes
/// exactly those requirements.
pub async fn sync(
    State(state): State<SharedState>,
    _admin: AdminCaller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if crate::api::error_bodies::declares_json(&headers) {
        return Err(ApiError::UnsupportedMediaType(
            "send the requirements.txt itself as the body (Content-Type: text/plain)".into(),
        ));
    }
    let text = std::str::from_utf8(&body).map_err(|e| {
        ApiError::BadRequest(format!("the requirements body is not UTF-8 text: {e}"))
    })?;
    let specs = requirements::parse(text)?;
    apply(state, Change::Sync { specs }).await
}

/// Builds the environment `change` asks for, rolls over to it, records it. The rollover's
/// slot is taken first: a reload (or another change) arriving during the install gets the
/// 409, not this change after its install.
async fn apply(state: SharedState, change: Change) -> Result<Json<Value>, ApiError> {
    super::to_completion(async move { apply_now(&state, change).await }).await
}

/// [`apply`] itself, on its own task.
async fn apply_now(state: &SharedState, change: Change) -> Result<Json<Value>, ApiError> {
    let slot = state
        .rollovers
        .reserve(&change.describe())
        .map_err(RolloverError::into_api)?;
    let guard = state.envs.begin()?;
    let live = state.config();
    let before = state.envs.manifest();
    tracing::info!(change = %change.describe(), "building a new environment generation");
    let prepared = guard.prepare(&change, &live).await.inspect_err(|e| {
        tracing::warn!(change = %change.describe(), error = %e, "the package change failed; nothing switched");
    })?;
    let prepared = match prepared {
        Prepare::Built(prepared) => *prepared,
        Prepare::Unchanged(unchanged) => {
            let why = unchanged.why.clone();
            let install_ms = unchanged.install_time.as_millis() as u64;
            guard.keep(unchanged)?;
            return Ok(Json(unchanged_answer(state, &why, install_ms)));
        }
    };
    // The live configuration again: a reload may have finished while uv ran.
    let next = NextGeneration {
        config: guard.next_config(&prepared, &state.config()),
        probe_imports: prepared.probe_imports.clone(),
        reason: prepared.reason.clone(),
        force: false,
    };
    let started = Instant::now();
    // On failure `prepared` is dropped here, which deletes its directory.
    let generation = match roll_over_in(state, &slot, next).await {
        Ok(Outcome::RolledOver(generation)) => generation,
        // Not reached (a new environment directory is a new configuration), but if it
        // were: nothing switched, and the new directory goes with `prepared`.
        Ok(Outcome::Unchanged(_)) => {
            let install_ms = prepared.install_time.as_millis() as u64;
            return Ok(Json(unchanged_answer(
                state,
                "the new environment is the serving one",
                install_ms,
            )));
        }
        Err(e) => {
            tracing::warn!(change = %change.describe(), error = %e, "the new generation was refused; nothing switched");
            return Err(e.into_api());
        }
    };
    let rollover_ms = started.elapsed().as_millis() as u64;
    let install_ms = prepared.install_time.as_millis() as u64;
    let bytecode = prepared.bytecode;
    let environment = prepared.dir.clone();
    let changed = prepared.changed.clone();
    guard.commit(prepared)?;
    let after = state.envs.manifest();
    let removed: Vec<&String> = before
        .requested
        .keys()
        .filter(|name| !after.requested.contains_key(*name))
        .collect();
    tracing::info!(
        change = %change.describe(),
        environment = %environment.display(),
        install_ms,
        pycs_reused = bytecode.reused,
        pycs_compiled = bytecode.compiled,
        rollover_ms,
        "package change done: workers use the new environment"
    );
    Ok(Json(json!({
        "rolled_over": true,
        "generation": generation,
        "environment": environment,
        "changed": changed,
        "removed": removed,
        "requested": after.requested.values().collect::<Vec<_>>(),
        "install_ms": install_ms,
        "bytecode": bytecode,
        "rollover_ms": rollover_ms,
    })))
}

/// The answer to a change that changed nothing: the same fields as a change's, empty where
/// nothing happened, with the serving generation and why nothing was done.
fn unchanged_answer(state: &SharedState, why: &str, install_ms: u64) -> Value {
    let live = state.config();
    let generation = state.generation();
    tracing::info!(
        why,
        generation = generation.id,
        "package change: nothing changed, no rollover"
    );
    json!({
        "rolled_over": false,
        "message": format!("nothing changed: {why}; generation {} keeps serving", generation.id),
        "generation": generation,
        "environment": live.python.venv,
        "changed": [],
        "removed": [],
        "requested": state.envs.manifest().requested.values().collect::<Vec<_>>(),
        "install_ms": install_ms,
        "rollover_ms": 0,
    })
}
