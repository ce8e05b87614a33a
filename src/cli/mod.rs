//! Command-line clients of a running service (`snakecage packages …`): they speak its
//! HTTP API like any other client, with an API key.

pub mod packages;
