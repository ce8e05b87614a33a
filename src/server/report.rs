//! What the running service reports of its sandbox: the layers in `snakecage_build_info`
//! and the status page, one log line per layer at start.

use snakecage_worker::protocol::{LayerReport, LayerState, ZygoteInfo};

use crate::metrics::BuildInfo;

/// What `snakecage_build_info` and the status page say is running.
pub fn build_info(zygote: &ZygoteInfo) -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        python_version: zygote.python_version.clone(),
        sandbox_layers: sandbox_layers(zygote),
    }
}

/// The sandbox layers the zygote's start-up probe found active, by name.
fn sandbox_layers(zygote: &ZygoteInfo) -> Vec<String> {
    zygote
        .sandbox
        .iter()
        .filter(|r| r.state == LayerState::Active)
        .map(|r| r.layer.as_str().to_owned())
        .collect()
}

/// One log line per sandbox layer: active ones at info, the others as warnings (a layer
/// switched off is for benchmarks only).
pub(super) fn log_sandbox(layers: &[LayerReport]) {
    for r in layers {
        let layer = r.layer.as_str();
        match r.state {
            LayerState::Active => tracing::info!(layer, detail = %r.detail, "sandbox layer active"),
            LayerState::Off => tracing::warn!(
                layer,
                detail = %r.detail,
                "SANDBOX LAYER SWITCHED OFF by configuration: workers run with less isolation"
            ),
            LayerState::Unavailable => tracing::warn!(
                layer,
                detail = %r.detail,
                "sandbox layer unavailable on this host; add it to sandbox.require to refuse to start"
            ),
        }
    }
}
