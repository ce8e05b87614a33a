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
/// may ask for (`max_timeout_ms`). `signal` is what ended its worker: SIGXCPU, the kernel's
/// CPU-time limit behind the clock, comes first when the run's threads together use CPU
/// faster than time passes, and then the timeout was not what it hit. Any other run is left
/// as it is.
pub fn explain(
    response: &mut ExecuteResponse,
    signal: Option<i32>,
    timeout: Duration,
    max_timeout_ms: u64,
) {
    if response.verdict != RunVerdict::Timeout {
        return;
    }
    let timeout_ms = timeout.as_millis();
    let message = if signal == Some(libc::SIGXCPU) {
        format!(
            "the run's worker used up its CPU time (all its threads together; its limit is \
             limits.max_timeout_ms and a second, a backstop behind the time limit) and was \
             killed by signal 24 (SIGXCPU) before its timeout of {timeout_ms} ms came"
        )
    } else {
        format!(
            "the run exceeded its timeout of {timeout_ms} ms (timeout_ms; the most allowed is \
             {max_timeout_ms} ms, limits.max_timeout_ms)"
        )
    };
    response.error = Some(ErrorInfo {
        kind: TIMEOUT_ERROR.to_owned(),
        message,
    });
}
