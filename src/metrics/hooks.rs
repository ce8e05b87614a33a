//! The calls the rest of the service makes to record what happened. Everything that moves a
//! counter or a histogram goes through here, so a new feature (sessions, sandbox layers)
//! adds a call, never a metric name.

use std::time::Duration;

use super::Metrics;
use super::labels::{Kind, Outcome, SessionEnd};
use crate::files::now_unix_ms;
use crate::pool::events::{KillReason, PoolEvents, Rejection};

impl Metrics {
    /// An execution ended (ran, or was shed with `Outcome::Rejected`), `took` after its
    /// request arrived. Never given code or output: only the request id.
    pub fn execution_finished(
        &self,
        kind: Kind,
        outcome: Outcome,
        took: Duration,
        request_id: Option<&str>,
    ) {
        self.executions
            .with_label_values(&[kind.as_str(), outcome.as_str()])
            .inc();
        if outcome != Outcome::Rejected {
            self.execution_duration
                .with_label_values(&[kind.as_str()])
                .observe(took.as_secs_f64());
        }
        self.recent
            .record(kind, outcome, took, request_id, now_unix_ms());
    }

    /// A session was created.
    pub fn session_created(&self) {
        self.sessions_created.inc();
        self.sessions_active.inc();
    }

    /// A session ended, and why.
    pub fn session_ended(&self, end: SessionEnd) {
        self.sessions_active.dec();
        match end {
            SessionEnd::Closed => self.sessions_closed.inc(),
            SessionEnd::Expired => self.sessions_expired.inc(),
            SessionEnd::Evicted => self.sessions_evicted.inc(),
            SessionEnd::Lost => self.sessions_lost.inc(),
        }
    }

    /// An HTTP request was answered; `route` is the route template (or `unmatched`).
    pub fn http_request(&self, route: &str, status: u16) {
        let status = status.to_string();
        self.http_requests
            .with_label_values(&[route, status.as_str()])
            .inc();
    }
}

impl PoolEvents for Metrics {
    fn queue_wait(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }

    fn rejected(&self, reason: Rejection) {
        self.queue_rejections
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    fn worker_spawned(&self, took: Duration) {
        self.spawn_duration.observe(took.as_secs_f64());
    }

    fn spawn_failed(&self) {
        self.spawn_failures.inc();
    }

    fn worker_killed(&self, reason: KillReason) {
        self.workers_killed
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    fn zygote_restarted(&self) {
        self.zygote_restarts.inc();
    }

    fn checked_out(&self, tier: &str, routed: &str) {
        self.tier_checkouts.with_label_values(&[tier, routed]).inc();
    }

    fn worker_started_cold(&self, tier: &str) {
        self.tier_cold_starts.with_label_values(&[tier]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_move_the_active_gauge_and_their_end_counters() {
        let m = Metrics::new();
        m.session_created();
        m.session_created();
        m.session_ended(SessionEnd::Expired);
        assert_eq!(m.sessions_active(), 1);
        let text = m.encode();
        assert!(
            text.contains("snakecage_sessions_created_total 2"),
            "{text}"
        );
        assert!(
            text.contains("snakecage_sessions_expired_total 1"),
            "{text}"
        );
        assert!(
            text.contains("snakecage_sessions_evicted_total 0"),
            "{text}"
        );
    }
}
