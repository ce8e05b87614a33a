//! Integration tests: the real `snakecage` binary on an ephemeral port with the real
//! zygote and workers. One module per area; `harness` starts and stops servers.

mod core;
mod escapes;
mod harness;
