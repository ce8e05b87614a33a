//! Bounded memories of the last executions, for the status page: their durations (for
//! p50/p99 over the last [`DURATION_WINDOW`] runs) and the last failures. Never code or
//! output: only when, what kind, what outcome, how long, and the request id.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use super::labels::{Kind, Outcome};

/// How many recent durations the percentiles are taken over.
pub const DURATION_WINDOW: usize = 1000;
/// How many recent failures are kept.
pub const FAILURE_WINDOW: usize = 20;

/// One failed (or shed) execution, as the status page lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    pub kind: Kind,
    pub outcome: &'static str,
    pub duration_ms: f64,
    pub request_id: Option<String>,
}

#[derive(Default)]
pub struct Recent {
    durations: Mutex<VecDeque<f64>>,
    failures: Mutex<VecDeque<Failure>>,
}

/// Percentiles over the recent window, in milliseconds; `None` before the first run.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// How many durations they were taken over.
    pub window: usize,
}

impl Recent {
    pub fn record(
        &self,
        kind: Kind,
        outcome: Outcome,
        took: Duration,
        request_id: Option<&str>,
        at_unix_ms: u64,
    ) {
        let ms = took.as_secs_f64() * 1000.0;
        if outcome != Outcome::Rejected {
            push_bounded(
                &mut self.durations.lock().expect("durations lock"),
                ms,
                DURATION_WINDOW,
            );
        }
        if !outcome.is_ok() {
            let failure = Failure {
                at_unix_ms,
                kind,
                outcome: outcome.as_str(),
                duration_ms: ms,
                request_id: request_id.map(str::to_owned),
            };
            push_bounded(
                &mut self.failures.lock().expect("failures lock"),
                failure,
                FAILURE_WINDOW,
            );
        }
    }

    pub fn percentiles(&self) -> Percentiles {
        let mut sorted: Vec<f64> = self
            .durations
            .lock()
            .expect("durations lock")
            .iter()
            .copied()
            .collect();
        sorted.sort_by(f64::total_cmp);
        Percentiles {
            p50_ms: nearest_rank(&sorted, 0.50),
            p99_ms: nearest_rank(&sorted, 0.99),
            window: sorted.len(),
        }
    }

    /// The last failures, newest first.
    pub fn failures(&self) -> Vec<Failure> {
        let failures = self.failures.lock().expect("failures lock");
        failures.iter().rev().cloned().collect()
    }
}

fn push_bounded<T>(ring: &mut VecDeque<T>, item: T, max: usize) {
    if ring.len() == max {
        ring.pop_front();
    }
    ring.push_back(item);
}

/// The nearest-rank percentile `q` (0..=1) of `sorted`.
fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::run::RunVerdict;

    #[test]
    fn percentiles_are_nearest_rank_over_the_window() {
        let recent = Recent::default();
        assert_eq!(recent.percentiles().p50_ms, None);
        for ms in 1..=100 {
            let outcome = Outcome::Ran(RunVerdict::Ok);
            recent.record(Kind::Stateless, outcome, Duration::from_millis(ms), None, 0);
        }
        let p = recent.percentiles();
        assert_eq!(
            (p.p50_ms, p.p99_ms, p.window),
            (Some(50.0), Some(99.0), 100)
        );
        // Rejections took no run time; they do not drag the percentiles down.
        recent.record(Kind::Stateless, Outcome::Rejected, Duration::ZERO, None, 0);
        assert_eq!(recent.percentiles().window, 100);
    }

    #[test]
    fn only_failures_are_kept_newest_first_and_bounded() {
        let recent = Recent::default();
        recent.record(
            Kind::Stateless,
            Outcome::Ran(RunVerdict::Ok),
            Duration::ZERO,
            Some("ok"),
            1,
        );
        for i in 0..(FAILURE_WINDOW as u64 + 5) {
            let id = format!("r{i}");
            recent.record(
                Kind::Stateless,
                Outcome::Ran(RunVerdict::Timeout),
                Duration::ZERO,
                Some(&id),
                i,
            );
        }
        let failures = recent.failures();
        assert_eq!(failures.len(), FAILURE_WINDOW);
        assert_eq!(
            failures[0].request_id.as_deref(),
            Some(format!("r{}", FAILURE_WINDOW + 4).as_str())
        );
        assert!(failures.iter().all(|f| f.outcome == "timeout"));
    }
}
