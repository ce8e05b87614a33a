//! Prometheus metrics: one registry, every family registered once with its closed label
//! set pre-filled (so a series reads 0 before its first event instead of being absent).
//!
//! - [`names`]: every metric and label name.
//! - [`labels`]: the closed label sets (`Kind`, `Outcome`, `SessionEnd`).
//! - [`hooks`]: the calls the rest of the service makes to record what happened
//!   (executions, sessions, and the pool's events through [`PoolEvents`]).
//! - [`recent`]: the last durations and failures, for the status page.
//! - [`http`]: the middleware counting HTTP requests by route and status.
//! - [`health`]: ready or not, each sandbox layer active or not, the file store's quota.
//! - [`cluster`]: the file store's operations and the forwarding of session calls.
//! - [`generation`]: rollovers by outcome and duration, the generation in use.
//!
//! Gauges that describe state (pool, file store, memory) are read when scraped, by
//! [`Metrics::observe`], rather than kept up to date on every change.
//!
//! [`PoolEvents`]: crate::pool::events::PoolEvents

pub mod cluster;
pub mod generation;
pub mod health;
pub mod hooks;
pub mod http;
pub mod labels;
pub mod names;
pub mod recent;
pub mod tools;

use std::sync::OnceLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use self::health::{HealthGauges, HealthReport};
use self::labels::{Kind, Outcome};
use self::names::label;
use self::recent::Recent;
use crate::pool::events::{KillReason, Rejection};
use crate::pool::{PoolStatus, TierState};

/// Execution durations: 100 µs (a trivial job on a warm worker) to 60 s (the longest
/// timeout allowed).
pub const EXECUTION_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];
/// Queue waits: mostly zero, up to the queue timeout (30 s by default).
pub const QUEUE_WAIT_BUCKETS: [f64; 18] = [
    0.00001, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
];
/// Worker start-up: fork, hardening, warm-up; about a millisecond, seconds when loaded.
pub const SPAWN_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0,
];

/// What `snakecage_build_info` says.
#[derive(Debug, Clone, Default)]
pub struct BuildInfo {
    pub version: String,
    pub python_version: String,
    /// The sandbox layers the zygote reported as active; empty: none.
    pub sandbox_layers: Vec<String>,
}

impl BuildInfo {
    /// The `sandbox_layers` label: the layers sorted and comma-separated, or `none`.
    pub fn layers_label(&self) -> String {
        if self.sandbox_layers.is_empty() {
            return "none".to_owned();
        }
        let mut layers = self.sandbox_layers.clone();
        layers.sort();
        layers.join(",")
    }
}

/// The service's metrics. Shared as `Arc<Metrics>`; every method takes `&self`.
pub struct Metrics {
    registry: Registry,
    build: std::sync::RwLock<Option<BuildInfo>>,
    build_info: IntGaugeVec,
    pub(crate) executions: IntCounterVec,
    tenant_executions: IntCounterVec,
    pub(crate) execution_duration: HistogramVec,
    pub(crate) queue_wait: Histogram,
    pub(crate) queue_rejections: IntCounterVec,
    pool_idle: IntGauge,
    pool_busy: IntGauge,
    pool_spawning: IntGauge,
    pool_target: IntGauge,
    pool_queue_depth: IntGauge,
    pool_queue_capacity: IntGauge,
    tier_idle: IntGaugeVec,
    tier_target_idle: IntGaugeVec,
    tier_spawning: IntGaugeVec,
    tier_state: IntGaugeVec,
    pub(crate) tier_checkouts: IntCounterVec,
    pub(crate) tier_cold_starts: IntCounterVec,
    pub(crate) spawn_duration: Histogram,
    pub(crate) spawn_failures: IntCounter,
    pub(crate) workers_killed: IntCounterVec,
    pub(crate) zygote_restarts: IntCounter,
    pub(crate) sessions_active: IntGauge,
    pub(crate) sessions_created: IntCounter,
    pub(crate) sessions_closed: IntCounter,
    pub(crate) sessions_expired: IntCounter,
    pub(crate) sessions_evicted: IntCounter,
    pub(crate) sessions_lost: IntCounter,
    files_stored: IntGauge,
    files_stored_bytes: IntGauge,
    pub(crate) http_requests: IntCounterVec,
    pub(crate) tool_calls: IntCounterVec,
    pub(crate) tool_call_duration: HistogramVec,
    pub(crate) tool_names: OnceLock<std::collections::BTreeSet<String>>,
    resident_memory: IntGauge,
    health: HealthGauges,
    pub(crate) recent: Recent,
    /// The file store and session forwarding.
    pub cluster: cluster::ClusterMetrics,
    generation: generation::GenerationMetrics,
}

/// What the file store holds, read at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreUsage {
    pub files: u64,
    pub bytes: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let reg = Registrar(&registry);
        let metrics = Self {
            build_info: reg.gauge_vec(
                names::BUILD_INFO,
                "Always 1; the labels say what is running.",
                &[label::VERSION, label::PYTHON_VERSION, label::SANDBOX_LAYERS],
            ),
            executions: reg.counter_vec(
                names::EXECUTIONS_TOTAL,
                "Executions by kind and outcome; rejected ones were shed without running.",
                &[label::KIND, label::OUTCOME],
            ),
            tenant_executions: reg.counter_vec(
                names::TENANT_EXECUTIONS_TOTAL,
                "Executions that ran, by API key (tenant) and kind; only with keys configured.",
                &[label::TENANT, label::KIND],
            ),
            execution_duration: reg.histogram_vec(
                names::EXECUTION_DURATION_SECONDS,
                "End-to-end duration of executions that ran, queue wait included.",
                &[label::KIND],
                &EXECUTION_BUCKETS,
            ),
            queue_wait: reg.histogram(
                names::QUEUE_WAIT_SECONDS,
                "How long requests waited for a worker.",
                &QUEUE_WAIT_BUCKETS,
            ),
            queue_rejections: reg.counter_vec(
                names::QUEUE_REJECTIONS_TOTAL,
                "Requests shed without running, by reason.",
                &[label::REASON],
            ),
            pool_idle: reg.gauge(
                names::POOL_IDLE_WORKERS,
                "Idle workers ready to take a job.",
            ),
            pool_busy: reg.gauge(names::POOL_BUSY_WORKERS, "Workers running a job."),
            pool_spawning: reg.gauge(
                names::POOL_SPAWNING_WORKERS,
                "Workers being forked and warmed up.",
            ),
            pool_target: reg.gauge(
                names::POOL_TARGET_SIZE,
                "Configured pool size: concurrent jobs and idle workers kept ready.",
            ),
            pool_queue_depth: reg.gauge(names::POOL_QUEUE_DEPTH, "Requests waiting for a worker."),
            pool_queue_capacity: reg.gauge(
                names::POOL_QUEUE_CAPACITY,
                "Requests that may wait before new ones get 429.",
            ),
            tier_idle: reg.gauge_vec(
                names::TIER_IDLE_WORKERS,
                "Idle workers ready to take a job, by tier.",
                &[label::TIER],
            ),
            tier_target_idle: reg.gauge_vec(
                names::TIER_TARGET_IDLE_WORKERS,
                "Idle workers each tier keeps ready now: its floor plus its share of recent demand.",
                &[label::TIER],
            ),
            tier_spawning: reg.gauge_vec(
                names::TIER_SPAWNING_WORKERS,
                "Workers being forked and warmed up, by tier.",
                &[label::TIER],
            ),
            tier_state: reg.gauge_vec(
                names::TIER_STATE,
                "1 for the state each tier is in (starting, serving, failed), 0 for the others.",
                &[label::TIER, label::STATE],
            ),
            tier_checkouts: reg.counter_vec(
                names::TIER_CHECKOUTS_TOTAL,
                "Workers taken for a job or session, by the tier that served and the tier the code's imports picked.",
                &[label::TIER, label::ROUTED],
            ),
            tier_cold_starts: reg.counter_vec(
                names::TIER_COLD_STARTS_TOTAL,
                "Workers started without their tier's warm-up because a job was already waiting for one, by tier.",
                &[label::TIER],
            ),
            spawn_duration: reg.histogram(
                names::WORKER_SPAWN_DURATION_SECONDS,
                "From asking the zygote for a worker to the worker being ready.",
                &SPAWN_BUCKETS,
            ),
            spawn_failures: reg.counter(
                names::WORKER_SPAWN_FAILURES_TOTAL,
                "Fork requests that failed before there was a worker.",
            ),
            workers_killed: reg.counter_vec(
                names::WORKERS_KILLED_TOTAL,
                "Workers killed or lost before finishing a job normally, by reason.",
                &[label::REASON],
            ),
            zygote_restarts: reg.counter(names::ZYGOTE_RESTARTS_TOTAL, "Dead zygotes replaced."),
            sessions_active: reg.gauge(names::SESSIONS_ACTIVE, "Python sessions alive."),
            sessions_created: reg.counter(names::SESSIONS_CREATED_TOTAL, "Sessions created."),
            sessions_closed: reg.counter(
                names::SESSIONS_CLOSED_TOTAL,
                "Sessions closed by their client.",
            ),
            sessions_expired: reg.counter(
                names::SESSIONS_EXPIRED_TOTAL,
                "Sessions ended after sitting idle past their TTL.",
            ),
            sessions_evicted: reg.counter(
                names::SESSIONS_EVICTED_TOTAL,
                "Sessions ended to make room for others.",
            ),
            sessions_lost: reg.counter(
                names::SESSIONS_LOST_TOTAL,
                "Sessions whose worker died or was killed.",
            ),
            files_stored: reg.gauge(names::FILES_STORED, "Files in the file store."),
            files_stored_bytes: reg.gauge(
                names::FILES_STORED_BYTES,
                "Bytes the files in the file store are charged against files.quota_mb (each \
                 its size in whole blocks, plus one block).",
            ),
            http_requests: reg.counter_vec(
                names::HTTP_REQUESTS_TOTAL,
                "HTTP requests answered, by route template and status code.",
                &[label::ROUTE, label::STATUS],
            ),
            tool_calls: reg.counter_vec(
                names::TOOL_CALLS_TOTAL,
                "Tool calls by sandboxed code, by tool (configured name, caller, unknown), provider and outcome.",
                &[label::TOOL, label::PROVIDER, label::OUTCOME],
            ),
            tool_call_duration: reg.histogram_vec(
                names::TOOL_CALL_DURATION_SECONDS,
                "From a tool call reaching the supervisor to its answer or cancellation, by provider.",
                &[label::PROVIDER],
                &tools::DURATION_BUCKETS,
            ),
            tool_names: OnceLock::new(),
            resident_memory: reg.gauge(
                names::PROCESS_RESIDENT_MEMORY_BYTES,
                "Resident memory of the supervisor process (workers not included).",
            ),
            health: HealthGauges::register(&reg),
            recent: Recent::default(),
            cluster: cluster::ClusterMetrics::new(&reg),
            generation: generation::GenerationMetrics::new(&reg),
            registry,
            build: std::sync::RwLock::new(None),
        };
        metrics.prefill();
        metrics
    }

    /// Says what is running (once the zygote has said hello, and again after each
    /// rollover: the series of the generation before is removed).
    pub fn set_build_info(&self, build: BuildInfo) {
        let layers = build.layers_label();
        let labels = [
            build.version.as_str(),
            build.python_version.as_str(),
            layers.as_str(),
        ];
        let mut current = self.build.write().expect("build info lock");
        self.build_info.reset();
        self.build_info.with_label_values(&labels).set(1);
        *current = Some(build);
    }

    /// Creates every series of the closed label sets at 0.
    fn prefill(&self) {
        for kind in Kind::ALL {
            for outcome in Outcome::ALL {
                self.executions
                    .with_label_values(&[kind.as_str(), outcome.as_str()]);
            }
            self.execution_duration.with_label_values(&[kind.as_str()]);
        }
        for reason in Rejection::ALL {
            self.queue_rejections.with_label_values(&[reason.as_str()]);
        }
        for reason in KillReason::ALL {
            self.workers_killed.with_label_values(&[reason.as_str()]);
        }
        self.prefill_tools();
    }

    /// Creates the per-tenant series of the configured keys at 0. Tenant labels only ever
    /// take these values: they come from the configured keys, never from a request.
    pub fn set_tenants<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            for kind in Kind::ALL {
                self.tenant_executions
                    .with_label_values(&[name, kind.as_str()]);
            }
        }
    }

    /// Creates the per-tier series at 0. Tier labels only ever take these values: the
    /// configured tier names.
    pub fn set_tiers(&self, names: &[String]) {
        for tier in names {
            self.tier_idle.with_label_values(&[tier.as_str()]);
            self.tier_target_idle.with_label_values(&[tier.as_str()]);
            self.tier_spawning.with_label_values(&[tier.as_str()]);
            self.tier_cold_starts.with_label_values(&[tier.as_str()]);
            for state in TierState::ALL {
                self.tier_state
                    .with_label_values(&[tier.as_str(), state.as_str()]);
            }
            for routed in names {
                self.tier_checkouts
                    .with_label_values(&[tier.as_str(), routed.as_str()]);
            }
        }
    }

    /// Counts an execution of a configured key's tenant that ran.
    pub fn tenant_execution(&self, tenant: &str, kind: Kind) {
        self.tenant_executions
            .with_label_values(&[tenant, kind.as_str()])
            .inc();
    }

    /// What is running; empty until [`Metrics::set_build_info`].
    pub fn build(&self) -> BuildInfo {
        self.build
            .read()
            .expect("build info lock")
            .clone()
            .unwrap_or_default()
    }

    /// Reads the state gauges: the pool, the file store, this process's memory.
    pub fn observe(&self, pool: &PoolStatus, store: Option<StoreUsage>) {
        self.pool_idle.set(gauge_value(pool.idle));
        self.pool_busy.set(gauge_value(pool.busy));
        self.pool_spawning.set(gauge_value(pool.spawning));
        self.pool_target.set(gauge_value(pool.target_size));
        self.pool_queue_depth.set(gauge_value(pool.queue_depth));
        self.pool_queue_capacity.set(gauge_value(pool.queue_length));
        for tier in &pool.tiers {
            let name = [tier.name.as_str()];
            self.tier_idle
                .with_label_values(&name)
                .set(gauge_value(tier.idle));
            self.tier_target_idle
                .with_label_values(&name)
                .set(gauge_value(tier.target_idle));
            self.tier_spawning
                .with_label_values(&name)
                .set(gauge_value(tier.spawning));
            for state in TierState::ALL {
                self.tier_state
                    .with_label_values(&[tier.name.as_str(), state.as_str()])
                    .set(i64::from(tier.state == state));
            }
        }
        if let Some(store) = store {
            self.files_stored
                .set(store.files.try_into().unwrap_or(i64::MAX));
            self.files_stored_bytes
                .set(store.bytes.try_into().unwrap_or(i64::MAX));
        }
        if let Some(rss) = resident_memory_bytes() {
            self.resident_memory.set(rss.try_into().unwrap_or(i64::MAX));
        }
    }

    /// Reads the health gauges: ready, the sandbox layers, the file store's quota.
    pub fn observe_health(&self, report: &HealthReport<'_>) {
        self.health.observe(report);
    }

    /// The registry in the Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encoding metrics into memory cannot fail");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }

    /// Executions so far of `kind` that ended with `outcome`.
    pub fn executions(&self, kind: Kind, outcome: Outcome) -> u64 {
        self.executions
            .with_label_values(&[kind.as_str(), outcome.as_str()])
            .get()
    }

    pub fn sessions_active(&self) -> i64 {
        self.sessions_active.get()
    }

    pub fn recent(&self) -> &Recent {
        &self.recent
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// VmRSS of this process, from /proc.
fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Registers metrics; a name or label that the registry refuses is a programming error
/// (a duplicate or malformed constant), caught by the first test that starts a server.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn register<M: prometheus::core::Collector + Clone + 'static>(&self, metric: M) -> M {
        self.0
            .register(Box::new(metric.clone()))
            .expect("metric names are unique and well-formed");
        metric
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::with_opts(Opts::new(name, help)).expect("counter"))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("counter vec"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::with_opts(Opts::new(name, help)).expect("gauge"))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("gauge vec"))
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.register(Histogram::with_opts(opts).expect("histogram"))
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.register(HistogramVec::new(opts, labels).expect("histogram vec"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::run::RunVerdict;

    fn metrics() -> Metrics {
        let m = Metrics::new();
        m.set_build_info(BuildInfo {
            version: "1.2.3".into(),
            python_version: "3.12.1".into(),
            sandbox_layers: Vec::new(),
        });
        m
    }

    #[test]
    fn every_name_is_registered_and_closed_label_sets_start_at_zero() {
        let m = metrics();
        // The one family without a closed label set shows once a request was answered, the
        // per-tenant ones once keys are configured.
        m.http_request("/health", 200);
        m.set_tenants(["alice"]);
        m.set_tiers(&["bare".to_owned(), "plotting".to_owned()]);
        let text = m.encode();
        for name in names::ALL {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} missing:\n{text}"
            );
        }
        assert!(
            text.contains("snakecage_executions_total{kind=\"stateless\",outcome=\"rejected\"} 0")
        );
        assert!(text.contains(
            "snakecage_build_info{python_version=\"3.12.1\",sandbox_layers=\"none\",version=\"1.2.3\"} 1"
        ));
    }

    #[test]
    fn an_execution_moves_its_counter_and_histogram() {
        let m = metrics();
        m.execution_finished(
            Kind::Stateless,
            Outcome::Ran(RunVerdict::Ok),
            std::time::Duration::from_micros(300),
            Some("req-1"),
        );
        assert_eq!(
            m.executions(Kind::Stateless, Outcome::Ran(RunVerdict::Ok)),
            1
        );
        let text = m.encode();
        assert!(text.contains(
            "snakecage_execution_duration_seconds_bucket{kind=\"stateless\",le=\"0.0005\"} 1"
        ));
        assert!(text.contains(
            "snakecage_execution_duration_seconds_bucket{kind=\"stateless\",le=\"0.00025\"} 0"
        ));
    }

    #[test]
    fn the_layers_label_is_sorted_or_none() {
        let mut build = metrics().build();
        assert_eq!(build.layers_label(), "none");
        build.sandbox_layers = vec!["seccomp".into(), "landlock".into()];
        assert_eq!(build.layers_label(), "landlock,seccomp");
    }
}
