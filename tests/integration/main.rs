//! Integration tests: the real `snakecage` binary on an ephemeral port with the real
//! zygote and workers. One module per area; `harness` starts and stops servers.

mod agents;
mod auth;
mod core;
mod dashboard;
mod errors;
mod escapes;
mod faults;
mod files;
mod grafana;
mod harness;
mod observability;
mod overload;
mod prom;
mod prometheus;
mod reliability;
mod replay;
mod rich;
mod sessions;
mod stream;
mod timeouts;
