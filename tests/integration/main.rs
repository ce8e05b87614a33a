//! Integration tests: the real `snakecage` binary on an ephemeral port with the real
//! zygote and workers. One module per area; `harness` starts and stops servers.

mod agents;
mod auth;
mod core;
mod escapes;
mod files;
mod harness;
mod observability;
mod overload;
mod prom;
mod sessions;
mod stream;
mod tiers;
