//! The metrics of running as a cluster: how long each file store operation takes and how
//! often the store fails, and the session calls forwarded to their owning replica.

use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounterVec};

use super::Registrar;
use super::names::{self, label};

/// Store round trips: a millisecond (a local disk, a cached answer) to a minute (a big
/// upload to a slow store).
const STORE_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// A file store operation (the `operation` label: a closed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Put,
    Get,
    Meta,
    List,
    Delete,
    Expire,
    Check,
}

impl StoreOp {
    pub const ALL: [StoreOp; 7] = [
        StoreOp::Put,
        StoreOp::Get,
        StoreOp::Meta,
        StoreOp::List,
        StoreOp::Delete,
        StoreOp::Expire,
        StoreOp::Check,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Put => "put",
            StoreOp::Get => "get",
            StoreOp::Meta => "meta",
            StoreOp::List => "list",
            StoreOp::Delete => "delete",
            StoreOp::Expire => "expire",
            StoreOp::Check => "check",
        }
    }
}

/// How a forwarded session call ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardOutcome {
    /// The owner answered (whatever its status).
    Answered,
    /// The owner could not be reached: the session or run is reported gone.
    Gone,
}

impl ForwardOutcome {
    pub const ALL: [ForwardOutcome; 2] = [ForwardOutcome::Answered, ForwardOutcome::Gone];

    pub fn as_str(self) -> &'static str {
        match self {
            ForwardOutcome::Answered => "answered",
            ForwardOutcome::Gone => "gone",
        }
    }
}

pub struct ClusterMetrics {
    store_seconds: HistogramVec,
    store_errors: IntCounterVec,
    forwards: IntCounterVec,
    forward_seconds: Histogram,
}

impl ClusterMetrics {
    pub(super) fn new(reg: &Registrar<'_>) -> Self {
        let metrics = Self {
            store_seconds: reg.histogram_vec(
                names::FILE_STORE_OPERATION_SECONDS,
                "File store operations by operation: time to the store's answer.",
                &[label::OPERATION],
                &STORE_BUCKETS,
            ),
            store_errors: reg.counter_vec(
                names::FILE_STORE_ERRORS_TOTAL,
                "File store operations that failed because the store could not serve them.",
                &[label::OPERATION],
            ),
            forwards: reg.counter_vec(
                names::SESSION_FORWARDS_TOTAL,
                "Session and run calls forwarded to the replica that owns the session or run, by outcome.",
                &[label::OUTCOME],
            ),
            forward_seconds: reg.histogram(
                names::SESSION_FORWARD_SECONDS,
                "From forwarding a session or run call to the owner's response head.",
                &STORE_BUCKETS,
            ),
        };
        for op in StoreOp::ALL {
            metrics.store_seconds.with_label_values(&[op.as_str()]);
            metrics.store_errors.with_label_values(&[op.as_str()]);
        }
        for outcome in ForwardOutcome::ALL {
            metrics.forwards.with_label_values(&[outcome.as_str()]);
        }
        metrics
    }

    /// One store operation took `took`; `failed` when the store could not serve it.
    pub fn store_operation(&self, op: StoreOp, took: Duration, failed: bool) {
        self.store_seconds
            .with_label_values(&[op.as_str()])
            .observe(took.as_secs_f64());
        if failed {
            self.store_errors.with_label_values(&[op.as_str()]).inc();
        }
    }

    /// A forwarded session call ended as `outcome` after `took` (to the response head).
    pub fn forwarded(&self, outcome: ForwardOutcome, took: Duration) {
        self.forwards.with_label_values(&[outcome.as_str()]).inc();
        if outcome == ForwardOutcome::Answered {
            self.forward_seconds.observe(took.as_secs_f64());
        }
    }

    /// Store errors counted for `op` (for tests).
    pub fn store_errors(&self, op: StoreOp) -> u64 {
        self.store_errors.with_label_values(&[op.as_str()]).get()
    }
}
