//! The gauges the alerts need to say the service is healthy: ready or not, each sandbox
//! layer active or not, the file store's quota, and the workspace file system's bound and
//! usage. Read when scraped, like the other
//! state gauges, from what `/ready` and `/health` report.

use prometheus::{IntGauge, IntGaugeVec};
use snakecage_worker::protocol::{Layer, LayerReport, LayerState};

use crate::pool::WorkspaceUsage;
use crate::pool::cgroup::WorkersMemory;

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
    /// The workspace file system now; `None`: it could not be read (the gauges keep
    /// their last values).
    pub workspace: Option<WorkspaceUsage>,
    /// The memory of all workers together; `None`: nothing bounds it (the gauges stay
    /// at 0).
    pub workers_memory: Option<WorkersMemory>,
}

pub(super) struct HealthGauges {
    ready: IntGauge,
    file_store_available: IntGauge,
    sandbox_layer_active: IntGaugeVec,
    files_quota_bytes: IntGauge,
    workspace_bounded: IntGauge,
    workspace_size_bytes: IntGauge,
    workspace_used_bytes: IntGauge,
    workspace_inodes: IntGauge,
    workspace_used_inodes: IntGauge,
    workers_memory_limit_bytes: IntGauge,
    workers_memory_used_bytes: IntGauge,
    workers_oom_kills: IntGauge,
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
            workspace_bounded: reg.gauge(
                names::WORKSPACE_BOUNDED,
                "1 while the workspaces are on the service's own bounded tmpfs, 0 while they share the base file system (GET /health says why).",
            ),
            workspace_size_bytes: reg.gauge(
                names::WORKSPACE_SIZE_BYTES,
                "Size of the file system holding the workspaces (the bound, workspace.size_mb, when bounded).",
            ),
            workspace_used_bytes: reg.gauge(
                names::WORKSPACE_USED_BYTES,
                "Bytes used on the file system holding the workspaces.",
            ),
            workspace_inodes: reg.gauge(
                names::WORKSPACE_INODES,
                "Inodes of the file system holding the workspaces (workspace.max_inodes when bounded).",
            ),
            workspace_used_inodes: reg.gauge(
                names::WORKSPACE_USED_INODES,
                "Inodes used on the file system holding the workspaces.",
            ),
            workers_memory_limit_bytes: reg.gauge(
                names::WORKERS_MEMORY_LIMIT_BYTES,
                "The memory of all workers together may not pass this (limits.max_total_memory_mb); 0: nothing bounds it.",
            ),
            workers_memory_used_bytes: reg.gauge(
                names::WORKERS_MEMORY_USED_BYTES,
                "The memory the kernel charges all workers together now, the workspace files they wrote included.",
            ),
            workers_oom_kills: reg.gauge(
                names::WORKERS_OOM_KILLS,
                "Workers the kernel's out-of-memory killer ended since the instance started.",
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
        let set = |gauge: &IntGauge, value: u64| gauge.set(value.try_into().unwrap_or(i64::MAX));
        set(
            &self.files_quota_bytes,
            report.files_quota_bytes.unwrap_or(0),
        );
        if let Some(ws) = &report.workspace {
            self.workspace_bounded.set(i64::from(ws.bounded));
            set(&self.workspace_size_bytes, ws.size_bytes);
            set(&self.workspace_used_bytes, ws.used_bytes);
            set(&self.workspace_inodes, ws.inodes);
            set(&self.workspace_used_inodes, ws.inodes_used);
        }
        if let Some(memory) = &report.workers_memory {
            set(&self.workers_memory_limit_bytes, memory.limit_bytes);
            if let Some(used) = memory.used_bytes {
                set(&self.workers_memory_used_bytes, used);
            }
            if let Some(kills) = memory.oom_kills {
                set(&self.workers_oom_kills, kills);
            }
        }
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
            workspace: Some(WorkspaceUsage {
                bounded: true,
                unbounded_because: None,
                bound_lost: false,
                size_bytes: 100 << 20,
                used_bytes: 95 << 20,
                inodes: 4096,
                inodes_used: 12,
                nearly_full: true,
            }),
            workers_memory: Some(WorkersMemory {
                limit_bytes: 120 << 20,
                used_bytes: Some(5 << 20),
                oom_kills: Some(2),
            }),
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
        for series in [
            "snakecage_workspace_bounded 1",
            "snakecage_workspace_size_bytes 104857600",
            "snakecage_workspace_used_bytes 99614720",
            "snakecage_workspace_inodes 4096",
            "snakecage_workspace_used_inodes 12",
            "snakecage_workers_memory_limit_bytes 125829120",
            "snakecage_workers_memory_used_bytes 5242880",
            "snakecage_workers_oom_kills 2",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
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
            workspace: None,
            workers_memory: None,
        });
        // A restarted zygote that could not set the layer up again.
        let lost = [report(Layer::Seccomp, LayerState::Unavailable)];
        m.observe_health(&HealthReport {
            ready: false,
            file_store_available: false,
            sandbox: &lost,
            files_quota_bytes: None,
            workspace: None,
            workers_memory: None,
        });
        let text = m.encode();
        assert!(
            text.contains("snakecage_sandbox_layer_active{layer=\"seccomp\"} 0"),
            "{text}"
        );
        assert!(text.contains("snakecage_ready 0"), "{text}");
        assert!(text.contains("snakecage_file_store_available 0"), "{text}");
        assert!(text.contains("snakecage_files_quota_bytes 0"), "{text}");
        assert!(
            text.contains("snakecage_workers_memory_limit_bytes 0"),
            "nothing bounds it: {text}"
        );
    }
}
