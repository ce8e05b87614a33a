//! Integration tests: the real `snakecage` binary on an ephemeral port with the real
//! zygote and workers. One module per area; `harness` starts and stops servers.

mod agents;
mod auth;
mod core;
mod escapes;
mod faults;
mod files;
mod harness;
mod observability;
mod overload;
mod prom;
mod reliability;
mod sessions;
mod stream;
