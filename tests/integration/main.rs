//! Integration tests: the real `snakecage` binary on an ephemeral port with the real
//! zygote and workers. One module per area; `harness` starts and stops servers.

mod agents;
mod auth;
mod backing;
mod cluster;
mod core;
mod dashboard;
mod errors;
mod escapes;
mod faults;
mod file_store;
mod files;
mod grafana;
mod harness;
mod kubernetes;
mod observability;
mod overload;
mod packages;
mod packages_cli;
mod packages_env;
mod prom;
mod prometheus;
mod reliability;
mod replay;
mod rich;
mod rollover;
mod s3_store;
mod sessions;
mod snapshot;
mod starting;
mod stream;
mod tiers;
mod timeouts;
mod tools;
mod tools_caller;
mod tools_mcp;
