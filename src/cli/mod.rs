//! The subcommands beside serving:
//!
//! - [`packages`]: `snakecage packages …`, a client of a running service: it speaks its
//!   HTTP API like any other client, with an API key.
//! - [`keys`]: `snakecage keys …`, the keys file edited where it lies.

pub mod keys;
pub mod packages;
