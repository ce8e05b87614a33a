//! The `error` of a run stopped at its time limit. The program raised nothing of its own (a
//! stateless worker is killed at the deadline; a session's run is interrupted), so without
//! this a timeout would say no more than its verdict: not the limit it hit, nor how far a
//! request may raise it.

use std::time::Duration;

use snakecage_worker::protocol::ErrorInfo;

use super::execute::ExecuteResponse;
use crate::pool::run::RunVerdict;

/// The exception type a timeout is reported as: Python's own name for one.
const TIMEOUT_ERROR: &str = "TimeoutError";

/// Gives a timed-out run its `error`: the limit it hit (`timeout`) and the most a request
/// may ask for (`max_timeout_ms`). Any other run is left as it is.
pub fn explain(response: &mut ExecuteResponse, timeout: Duration, max_timeout_ms: u64) {
    if response.verdict != RunVerdict::Timeout {
        return;
    }
    response.error = Some(ErrorInfo {
        kind: TIMEOUT_ERROR.to_owned(),
        message: format!(
            "the run exceeded its timeout of {} ms (timeout_ms; the most allowed is {} ms, \
             limits.max_timeout_ms)",
            timeout.as_millis(),
            max_timeout_ms
        ),
    });
}
