//! The gauges the alerts need to say the service is healthy: ready or not, each sandbox
//! layer active or not, and the file store's quota. Read when scraped, like the other
//! state gauges, from what `/ready` and `/health` report.

use prometheus::{IntGauge, IntGaugeVec};
use snakecage_worker::protocol::{Layer, LayerReport, LayerState};

use super::Registrar;
use super::names::{self, label};

/// What the health gauges say at one scrape.
#[derive(Debug, Clone, Default)]
pub struct HealthReport<'a> {
    /// Whether `/ready` answers 200.
    pub ready: bool,
    /// Whether the file store's last check found it able to serve (or it was not checked
    /// yet).
    pub file_store_available: bool,
    /// The current zygote's report of each sandbox layer; a layer not listed is not active.
    pub sandbox: &'a [LayerReport],
    /// The file store's quota (`files.quota_mb`); `None`: no quota.
    pub files_quota_bytes: Option<u64>,
}

pub(super) struct HealthGauges {
    ready: IntGauge,
    file_store_available: IntGauge,
    sandbox_layer_active: IntGaugeVec,
    files_quota_bytes: IntGauge,
}

impl HealthGauges {
    pub(super) fn register(reg: &Registrar<'_>) -> Self {
        let gauges = Self {
            ready: reg.gauge(
                names::READY,
                "1 while /ready answers 200 (workers ready, zygote up, not shutting down), else 0.",
            ),
            file_store_available: reg.gauge(
                names::FILE_STORE_AVAILABLE,
                "0 while the file store's last background check failed (GET /health says why), else 1.",
            ),
            sandbox_layer_active: reg.gauge_vec(
                names::SANDBOX_LAYER_ACTIVE,
                "1 when the current zygote reports the sandbox layer active, else 0.",
                &[label::LAYER],
            ),
            files_quota_bytes: reg.gauge(
                names::FILES_QUOTA_BYTES,
                "The file store's quota (files.quota_mb) in bytes; 0: no quota.",
            ),
        };
        // Every layer starts at 0 (not active) until a zygote has said otherwise.
        for layer in Layer::ALL {
            gauges
                .sandbox_layer_active
                .with_label_values(&[layer.as_str()]);
        }
        gauges
    }

    pub(super) fn observe(&self, report: &HealthReport<'_>) {
        self.ready.set(i64::from(report.ready));
        self.file_store_available
            .set(i64::from(report.file_store_available));
        for layer in Layer::ALL {
            let active = report
                .sandbox
                .iter()
                .any(|r| r.layer == layer && r.state == LayerState::Active);
            self.sandbox_layer_active
                .with_label_values(&[layer.as_str()])
                .set(i64::from(active));
        }
        let quota = report.files_quota_bytes.unwrap_or(0);
        self.files_quota_bytes
            .set(quota.try_into().unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    fn report(layer: Layer, state: LayerState) -> LayerReport {
        LayerReport {
            layer,
            state,
            detail: String::new(),
        }
    }

    #[test]
    fn every_layer_is_a_series_and_only_active_ones_read_one() {
        let m = Metrics::new();
        let text = m.encode();
        for layer in Layer::ALL {
            let series = format!(
                "{}{{layer=\"{}\"}} 0",
                names::SANDBOX_LAYER_ACTIVE,
                layer.as_str()
            );
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
        assert!(text.contains("snakecage_ready 0"), "{text}");

        let sandbox = [
            report(Layer::Seccomp, LayerState::Active),
            report(Layer::Landlock, LayerState::Unavailable),
            report(Layer::AuditHook, LayerState::Off),
        ];
        m.observe_health(&HealthReport {
            ready: true,
            file_store_available: true,
            sandbox: &sandbox,
            files_quota_bytes: Some(5 << 20),
        });
        let text = m.encode();
        assert!(text.contains("snakecage_ready 1"), "{text}");
        assert!(text.contains("snakecage_file_store_available 1"), "{text}");
        assert!(
            text.contains("snakecage_sandbox_layer_active{layer=\"seccomp\"} 1"),
            "{text}"
        );
        for off in ["landlock", "audit_hook", "rlimits"] {
            let series = format!("snakecage_sandbox_layer_active{{layer=\"{off}\"}} 0");
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
        assert!(
            text.contains("snakecage_files_quota_bytes 5242880"),
            "{text}"
        );
    }

    #[test]
    fn a_later_report_takes_a_layer_back_and_no_quota_reads_zero() {
        let m = Metrics::new();
        let active = [report(Layer::Seccomp, LayerState::Active)];
        m.observe_health(&HealthReport {
            ready: true,
            file_store_available: true,
            sandbox: &active,
            files_quota_bytes: Some(1),
        });
        // A restarted zygote that could not set the layer up again.
        let lost = [report(Layer::Seccomp, LayerState::Unavailable)];
        m.observe_health(&HealthReport {
            ready: false,
            file_store_available: false,
            sandbox: &lost,
            files_quota_bytes: None,
        });
        let text = m.encode();
        assert!(
            text.contains("snakecage_sandbox_layer_active{layer=\"seccomp\"} 0"),
            "{text}"
        );
        assert!(text.contains("snakecage_ready 0"), "{text}");
        assert!(text.contains("snakecage_file_store_available 0"), "{text}");
        assert!(text.contains("snakecage_files_quota_bytes 0"), "{text}");
    }
}
