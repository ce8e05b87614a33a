//! The probe a new generation must pass before the pool switches to it: a real worker of
//! each tier, forked and hardened like any other, runs `probe.py` as a job, which imports
//! every module the rollover names. A failed import fails the probe with its traceback.
//! It is background work: it keeps the worker's `SCHED_IDLE` priority (live requests come
//! first) and is raised to normal only if it still runs after [`PROBE_PATIENCE`].

use std::time::Duration;

use snakecage_worker::protocol::Job;

use super::capture::last_lines;
use super::run::{self, RunLimits};
use super::worker::Worker;

/// The probe job's source (a real `.py` file, tested as Python).
const PROBE_PY: &str = include_str!("../../worker/python/probe.py");

/// How long a probe job may take (imports of big packages take seconds on a busy host).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the probe runs at idle priority before it is raised (on a host so busy that
/// idle work barely runs, the rollover must still finish).
pub(super) const PROBE_PATIENCE: Duration = Duration::from_secs(5);

/// Runs the probe on `worker` (which dies after it, like after any job). The error is the
/// traceback's last line and the tail of what the worker wrote to stderr.
pub(super) async fn probe(mut worker: Worker, imports: &[String]) -> Result<(), String> {
    let job = Job {
        code: PROBE_PY.to_owned(),
        stdin: Some(serde_json::to_string(imports).expect("a list of strings serialises")),
        last_line_interactive: false,
        entrypoint: None,
        args: Vec::new(),
        max_bundle_bytes: 0,
        timeout_ms: 0,
        tools: Vec::new(),
        max_concurrent_tool_calls: 1,
    };
    let limits = RunLimits {
        timeout: PROBE_TIMEOUT,
        max_output_bytes: 64 << 10,
        tools: None,
        cancel: None,
        background: Some(PROBE_PATIENCE),
    };
    let outcome = run::run(&mut worker, job, &limits, None)
        .await
        .map_err(|e| format!("the probe worker was lost: {e}"))?;
    if outcome.exit_code == Some(0) {
        return Ok(());
    }
    if outcome.timed_out {
        return Err(format!(
            "the probe job did not finish within {} s",
            PROBE_TIMEOUT.as_secs()
        ));
    }
    let stderr = outcome.stderr.trim_end();
    let last = stderr.lines().last().unwrap_or("");
    let tail = last_lines(stderr, 2000);
    Err(if last.is_empty() {
        format!(
            "the probe job failed (exit {:?}, signal {:?}) without a message",
            outcome.exit_code, outcome.signal
        )
    } else {
        format!("{last}\n{tail}")
    })
}
