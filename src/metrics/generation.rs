//! Generation metrics: rollovers by outcome, how long they took, and the generation the
//! pool serves new workers from.

use std::time::Duration;

use prometheus::{Histogram, IntCounterVec, IntGauge};

use super::names::{self, label};
use super::{Metrics, Registrar};

/// The closed `outcome` label of the rollover counter.
pub const ROLLOVER_OUTCOMES: [&str; 2] = ["succeeded", "failed"];

/// A rollover starts zygotes that preload (seconds with numpy and pandas), then probes.
pub const ROLLOVER_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

pub struct GenerationMetrics {
    rollovers: IntCounterVec,
    duration: Histogram,
    current: IntGauge,
}

impl GenerationMetrics {
    pub(super) fn new(reg: &Registrar<'_>) -> Self {
        let rollovers = reg.counter_vec(
            names::ROLLOVERS_TOTAL,
            "Rollovers to a new zygote generation (reload, package changes), by outcome.",
            &[label::OUTCOME],
        );
        for outcome in ROLLOVER_OUTCOMES {
            rollovers.with_label_values(&[outcome]);
        }
        Self {
            rollovers,
            duration: reg.histogram(
                names::ROLLOVER_DURATION_SECONDS,
                "From a rollover's start to its switch (or failure): zygotes started, warmed up and probed.",
                &ROLLOVER_BUCKETS,
            ),
            current: reg.gauge(
                names::GENERATION,
                "The zygote generation new workers come from (1 at start, one more per rollover).",
            ),
        }
    }
}

impl Metrics {
    /// The generation serving now.
    pub fn set_generation(&self, id: u64) {
        self.generation
            .current
            .set(i64::try_from(id).unwrap_or(i64::MAX));
    }

    /// One rollover ended with `outcome` (`succeeded` or `failed`) after `took`; `serving`
    /// is the generation in use afterwards.
    pub fn rollover_finished(&self, outcome: &str, took: Duration, serving: u64) {
        self.generation
            .rollovers
            .with_label_values(&[outcome])
            .inc();
        self.generation.duration.observe(took.as_secs_f64());
        self.set_generation(serving);
    }
}
