//! The messages that cross process boundaries, one enum per direction.
//!
//! supervisor → zygote: [`ControlRequest`] on the control socket (SOCK_SEQPACKET, file
//! descriptors in SCM_RIGHTS); zygote → supervisor: [`ControlReply`].
//! supervisor → worker: [`JobRequest`] on the job socket; worker → supervisor:
//! [`WorkerMessage`]. User output never travels here: it goes through the worker's fd 1 and 2.
//!
//! - `config.rs`: the zygote's start-up configuration and worker limits.
//! - `sandbox.rs`: the isolation layers, as configured and as probed.
//! - `control.rs`: the control socket's messages.
//! - `job.rs`: the job socket's messages, a job and its result.
//! - `tools.rs`: host tool calls over the job socket.
//!
//! Every type is re-exported here: `protocol::Job`, `protocol::ControlReply`, ...

mod config;
mod control;
mod job;
mod sandbox;
mod tools;

pub use config::{WarmUp, WorkerLimits, ZygoteConfig};
pub use control::{
    ControlReply, ControlRequest, ExitStatus, FORK_FDS, PackageInfo, PreloadedModule, ZygoteInfo,
};
pub use job::{
    EXIT_HARDENING_FAILED, EXIT_PROTOCOL, ErrorInfo, Job, JobRequest, JobResult, MimeBundle,
    Variable, WorkerMessage,
};
pub use sandbox::{CgroupPlan, Layer, LayerReport, LayerState, SandboxConfig};
pub use tools::{ToolCall, ToolErrorKind, ToolOutcome, ToolResult};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{MAX_FRAME_LEN, decode_exact, encode};

    #[test]
    fn messages_have_a_stable_tagged_wire_form() {
        let msg = WorkerMessage::Result(JobResult {
            exit_code: 1,
            memory_error: false,
            error: Some(ErrorInfo {
                kind: "ZeroDivisionError".into(),
                message: "division by zero".into(),
            }),
            results: Vec::new(),
        });
        let json = serde_json::to_value(&msg).unwrap();
        assert_eq!(json["type"], "result");
        assert_eq!(json["error"]["type"], "ZeroDivisionError");
        let reply = ControlReply::Exited {
            pid: 9,
            status: ExitStatus::Signal(9),
        };
        let back: ControlReply = decode_exact(&encode(&reply).unwrap(), MAX_FRAME_LEN).unwrap();
        assert!(matches!(
            back,
            ControlReply::Exited {
                pid: 9,
                status: ExitStatus::Signal(9)
            }
        ));
    }
}
