//! Counts every HTTP response by route template and status. The route is axum's matched
//! path (`/v1/files/{file_id}`, never the id itself), so the label set stays closed.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::Metrics;
use super::names::UNMATCHED_ROUTE;

pub async fn count_requests(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let response = next.run(request).await;
    metrics.http_request(
        route.as_deref().unwrap_or(UNMATCHED_ROUTE),
        response.status().as_u16(),
    );
    response
}
