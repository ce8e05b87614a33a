//! snakecage: runs untrusted Python in pre-forked, sandboxed CPython workers behind an
//! HTTP API compatible with the Onyx code interpreter.
//!
//! - [`config`]: defaults, TOML file, `SNAKECAGE_*` environment, CLI flags.
//! - [`server`]: `serve(listener, config, shutdown)`, used by the tests and benches;
//!   `main` calls `serve_with` to have SIGHUP reload.
//! - [`api`]: the router and its handlers.
//! - [`auth`]: API keys, tenants and their limits, the middleware that requires a key.
//! - [`cli`]: command-line clients of a running service (`snakecage packages …`).
//! - [`error`]: `ApiError`, the one place statuses and `detail`s are decided.
//! - [`markdown`]: the Python blocks of a model's markdown answer (`code_format: markdown`).
//! - [`tools`], [`mcp`], [`packages`]: what agents see: tool definitions (OpenAI, Anthropic,
//!   MCP) generated from the live configuration, the MCP server, the importable packages.
//! - [`generation`], [`live`]: zygote generations and zero-downtime rollover (reload,
//!   package changes), and the live configuration and packages of the one serving now.
//! - [`envs`]: operator package management: environment generations built with `uv`, the
//!   manifest that survives a restart, old generations deleted when unused.
//! - [`pool`]: the zygotes (one per tier), the pre-forked workers, one run of one job.
//! - [`imports`]: the modules a job's code imports, read statically to pick its tier.
//! - [`shutdown`]: the SIGTERM/SIGINT future, and start-up steps that give way to it.
//! - [`hangup`]: SIGHUP, which reloads as `POST /v1/admin/reload` does.
//! - [`state_lock`]: the lock by which one running instance owns a state directory.
//! - [`codemode`]: host tools sandboxed code calls (`from snakecage import tools`): the
//!   catalog, its providers (caller over SSE, HTTP, upstream MCP), per-run limits.
//! - [`runs`]: runs in progress by id (cancel, answer a tool call).
//! - [`sessions`]: stateful Python sessions (registry, expiry, eviction).
//! - [`cluster`]: replicas: session ids that name their owner, forwarding session calls.
//! - [`files`]: the file store (uploads, run outputs), staging into and collecting from
//!   workspaces.
//! - [`metrics`]: Prometheus metrics (names, closed label sets, the hooks that record),
//!   and the recent executions the status page shows.
//!
//! The supervisor never forks and never links CPython: the zygote (`snakecage-worker`)
//! does that, and the two speak the protocol in the `snakecage_worker` library.

pub mod api;
pub mod auth;
pub mod cli;
pub mod cluster;
pub mod codemode;
pub mod config;
pub mod envs;
pub mod error;
pub mod files;
pub mod generation;
pub mod hangup;
pub mod imports;
pub mod live;
pub mod markdown;
pub mod mcp;
pub mod metrics;
pub mod packages;
pub mod pool;
pub mod runs;
pub mod server;
pub mod sessions;
pub mod shutdown;
pub mod state_lock;
pub mod tools;
