//! Integration tests: the real `snakecage` binary on an ephemeral port with the real
//! zygote and workers. One module per area; `harness` starts and stops servers.

mod agents;
mod auth;
mod core;
mod errors;
mod escapes;
mod files;
mod harness;
mod observability;
mod overload;
mod prom;
mod replay;
mod rich;
mod sessions;
mod stream;
mod timeouts;
