//! snakecage-worker's library: what the supervisor and the zygote share, without PyO3.
//!
//! - [`frame`]: the length-prefixed frame codec, with its limits.
//! - [`protocol`]: the messages, one enum per direction.
//! - [`fdpass`]: sending and receiving one record with file descriptors (SCM_RIGHTS) on a
//!   SOCK_SEQPACKET socket.
//! - [`toolspec`]: a host tool as user code sees it, and the one search over tools.
//! - [`jsondepth`]: how deep JSON nests, and the one limit on a tool call's arguments and
//!   result.
//! - [`allowlist`]: the standard-library import allowlist (`python-stdlib-allowlist`),
//!   embedded and parsed in this one place.
//! - [`capability`]: whether this process may raise another out of `SCHED_IDLE`, or raise
//!   its resource limits.
//! - [`distinfo`]: installed distributions read from their `.dist-info` files, bounded and
//!   untrusted, and which one provides a module (package management; the package scan).
//!
//! The zygote binary (`src/main.rs`, feature `zygote`) adds CPython and the sandbox layers.

pub mod allowlist;
pub mod capability;
pub mod distinfo;
pub mod fdpass;
pub mod frame;
pub mod jsondepth;
pub mod protocol;
pub mod toolspec;
