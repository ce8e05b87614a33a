//! Every metric name and label name snakecage exports: the one place they are spelled.
//! The dashboard (`deploy/grafana/snakecage.json`) and the tests use these names; a test
//! checks that every series the dashboard queries is one of them.

/// Executions by `kind` and `outcome` (ok, error, timeout, memory_limit, output_limit,
/// killed, rejected).
pub const EXECUTIONS_TOTAL: &str = "snakecage_executions_total";
/// End-to-end duration of executions that ran (queue wait, staging, run, collecting
/// files), by `kind`.
pub const EXECUTION_DURATION_SECONDS: &str = "snakecage_execution_duration_seconds";
/// Executions that ran, by `tenant` (the API key's name) and `kind`. Only with API keys
/// configured: the tenants are the configured names, a closed set.
pub const TENANT_EXECUTIONS_TOTAL: &str = "snakecage_tenant_executions_total";
/// How long requests waited for a worker.
pub const QUEUE_WAIT_SECONDS: &str = "snakecage_queue_wait_seconds";
/// Requests shed without running, by `reason` (queue_full, queue_timeout, shutting_down).
pub const QUEUE_REJECTIONS_TOTAL: &str = "snakecage_queue_rejections_total";

/// Idle, pre-forked workers ready to take a job.
pub const POOL_IDLE_WORKERS: &str = "snakecage_pool_idle_workers";
/// Workers running a job.
pub const POOL_BUSY_WORKERS: &str = "snakecage_pool_busy_workers";
/// Workers being forked and warmed up.
pub const POOL_SPAWNING_WORKERS: &str = "snakecage_pool_spawning_workers";
/// `pool.size`: jobs that run at once, and idle workers kept ready.
pub const POOL_TARGET_SIZE: &str = "snakecage_pool_target_size";
/// Requests waiting for a worker.
pub const POOL_QUEUE_DEPTH: &str = "snakecage_pool_queue_depth";
/// `pool.queue_length`: how many may wait before requests get 429.
pub const POOL_QUEUE_CAPACITY: &str = "snakecage_pool_queue_capacity";

/// Idle workers of each `tier` (the configured tier names, a closed set).
pub const TIER_IDLE_WORKERS: &str = "snakecage_tier_idle_workers";
/// Idle workers each `tier` keeps ready now (its floor plus its share of recent demand).
pub const TIER_TARGET_IDLE_WORKERS: &str = "snakecage_tier_target_idle_workers";
/// Workers of each `tier` being forked and warmed up.
pub const TIER_SPAWNING_WORKERS: &str = "snakecage_tier_spawning_workers";
/// Workers taken from each `tier` for a job or session, by the tier its imports picked
/// (`routed`); the two differ when a fuller tier served because the routed one had no
/// idle worker.
pub const TIER_CHECKOUTS_TOTAL: &str = "snakecage_tier_checkouts_total";
pub const TIER_COLD_STARTS_TOTAL: &str = "snakecage_tier_cold_starts_total";
/// 1 for the `state` each `tier` is in, 0 for the others: `starting` (its zygote is
/// preloading, or its first worker is on its way; its jobs run on a tier that serves),
/// `serving`, `failed` (its zygote could not start; retried).
pub const TIER_STATE: &str = "snakecage_tier_state";

/// From asking the zygote for a worker to the worker saying Ready.
pub const WORKER_SPAWN_DURATION_SECONDS: &str = "snakecage_worker_spawn_duration_seconds";
/// Fork requests that failed before there was a worker.
pub const WORKER_SPAWN_FAILURES_TOTAL: &str = "snakecage_worker_spawn_failures_total";
/// Workers killed or lost before finishing a job normally, by `reason`.
pub const WORKERS_KILLED_TOTAL: &str = "snakecage_workers_killed_total";
/// Dead zygotes replaced.
pub const ZYGOTE_RESTARTS_TOTAL: &str = "snakecage_zygote_restarts_total";

/// Python sessions alive now.
pub const SESSIONS_ACTIVE: &str = "snakecage_sessions_active";
pub const SESSIONS_CREATED_TOTAL: &str = "snakecage_sessions_created_total";
/// Sessions closed by their client.
pub const SESSIONS_CLOSED_TOTAL: &str = "snakecage_sessions_closed_total";
/// Sessions ended because they sat idle past their TTL.
pub const SESSIONS_EXPIRED_TOTAL: &str = "snakecage_sessions_expired_total";
/// Sessions ended to make room (the session limit was reached).
pub const SESSIONS_EVICTED_TOTAL: &str = "snakecage_sessions_evicted_total";
/// Sessions whose worker died or had to be killed (their state is gone; calls get 410).
pub const SESSIONS_LOST_TOTAL: &str = "snakecage_sessions_lost_total";

/// Files in the file store.
pub const FILES_STORED: &str = "snakecage_files_stored";
/// What the files in the file store are charged against its quota (each its size in
/// whole blocks plus one block).
pub const FILES_STORED_BYTES: &str = "snakecage_files_stored_bytes";

/// The file store's quota (`files.quota_mb`) in bytes; 0 when there is none.
pub const FILES_QUOTA_BYTES: &str = "snakecage_files_quota_bytes";

/// 1 while the workspaces are on the service's own bounded tmpfs (`workspace.mount`),
/// 0 while they share the base directory's file system (`/health` says why).
pub const WORKSPACE_BOUNDED: &str = "snakecage_workspace_bounded";
/// The size of the file system holding the workspaces (the bound, when bounded).
pub const WORKSPACE_SIZE_BYTES: &str = "snakecage_workspace_size_bytes";
/// The bytes all workspaces take on it now (for an unbounded one: everything on it).
pub const WORKSPACE_USED_BYTES: &str = "snakecage_workspace_used_bytes";
/// Its inodes (`workspace.max_inodes`, when bounded).
pub const WORKSPACE_INODES: &str = "snakecage_workspace_inodes";
/// The inodes used on it now.
pub const WORKSPACE_USED_INODES: &str = "snakecage_workspace_used_inodes";
/// `limits.max_total_memory_mb` as the kernel took it: the memory of all workers together.
/// 0 where nothing bounds it (as are the two below).
pub const WORKERS_MEMORY_LIMIT_BYTES: &str = "snakecage_workers_memory_limit_bytes";
/// What the kernel charges all workers together now (the workspace files they wrote
/// included).
pub const WORKERS_MEMORY_USED_BYTES: &str = "snakecage_workers_memory_used_bytes";
/// Workers the kernel's out-of-memory killer ended since the instance started (the
/// memory cgroup's own count, read at each scrape: a gauge that only grows).
pub const WORKERS_OOM_KILLS: &str = "snakecage_workers_oom_kills";
/// 1 while `/ready` answers 200, else 0 (no worker yet, zygote down, shutting down).
pub const READY: &str = "snakecage_ready";
/// 0 while the file store's last background check failed (`/health` says why), else 1.
/// Not part of readiness: with S3 every replica shares the store.
pub const FILE_STORE_AVAILABLE: &str = "snakecage_file_store_available";
/// 1 when the current zygote reports the sandbox `layer` active, else 0 (off by
/// configuration, unavailable on this host, or no zygote yet). One series per layer.
pub const SANDBOX_LAYER_ACTIVE: &str = "snakecage_sandbox_layer_active";
/// File store operations, by `operation` (put, get, meta, list, delete, expire, check)
/// and backend; time to the operation's answer (for `get`, until the bytes start flowing).
pub const FILE_STORE_OPERATION_SECONDS: &str = "snakecage_file_store_operation_seconds";
/// File store operations that failed because the store could not serve them (unreachable,
/// refused), by `operation`. Not found, too large and quota are answers, not errors.
pub const FILE_STORE_ERRORS_TOTAL: &str = "snakecage_file_store_errors_total";
/// Session and run calls forwarded to the replica that owns the session or run (the name
/// is older than run forwarding), by `outcome` (answered, gone: the owner could not be
/// reached, failed: it broke off mid-answer).
pub const SESSION_FORWARDS_TOTAL: &str = "snakecage_session_forwards_total";
/// From forwarding a session or run call to the owner's response head.
pub const SESSION_FORWARD_SECONDS: &str = "snakecage_session_forward_seconds";

/// HTTP requests answered, by `route` (the route template, or `unmatched`) and `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "snakecage_http_requests_total";

/// The supervisor's resident memory.
pub const PROCESS_RESIDENT_MEMORY_BYTES: &str = "snakecage_process_resident_memory_bytes";

/// Always 1; the labels say what is running: `version`, `python_version`,
/// `sandbox_layers` (comma-separated, or `none`).
pub const BUILD_INFO: &str = "snakecage_build_info";

/// Rollovers to a new zygote generation, by `outcome` (`succeeded`, `failed`).
pub const ROLLOVERS_TOTAL: &str = "snakecage_rollovers_total";
/// How long a rollover took, from its start to the switch (or its failure).
pub const ROLLOVER_DURATION_SECONDS: &str = "snakecage_rollover_duration_seconds";
/// The zygote generation new workers come from.
pub const GENERATION: &str = "snakecage_generation";

/// Label names.
pub mod label {
    pub const KIND: &str = "kind";
    pub const OUTCOME: &str = "outcome";
    pub const REASON: &str = "reason";
    pub const ROUTE: &str = "route";
    pub const STATUS: &str = "status";
    pub const VERSION: &str = "version";
    pub const PYTHON_VERSION: &str = "python_version";
    pub const SANDBOX_LAYERS: &str = "sandbox_layers";
    pub const TENANT: &str = "tenant";
    pub const TIER: &str = "tier";
    pub const ROUTED: &str = "routed";
    pub const STATE: &str = "state";
    pub const LAYER: &str = "layer";
    pub const OPERATION: &str = "operation";
    pub const TOOL: &str = "tool";
    pub const PROVIDER: &str = "provider";
}

/// The `route` of a request no route matched (so unknown paths cannot grow the label set).
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Every metric family name, for checks that nothing refers to a name that does not exist.
pub const ALL: [&str; 52] = [
    TOOL_CALLS_TOTAL,
    TOOL_CALL_DURATION_SECONDS,
    EXECUTIONS_TOTAL,
    TENANT_EXECUTIONS_TOTAL,
    EXECUTION_DURATION_SECONDS,
    QUEUE_WAIT_SECONDS,
    QUEUE_REJECTIONS_TOTAL,
    POOL_IDLE_WORKERS,
    POOL_BUSY_WORKERS,
    POOL_SPAWNING_WORKERS,
    POOL_TARGET_SIZE,
    POOL_QUEUE_DEPTH,
    POOL_QUEUE_CAPACITY,
    TIER_IDLE_WORKERS,
    TIER_TARGET_IDLE_WORKERS,
    TIER_SPAWNING_WORKERS,
    TIER_CHECKOUTS_TOTAL,
    TIER_STATE,
    WORKER_SPAWN_DURATION_SECONDS,
    WORKER_SPAWN_FAILURES_TOTAL,
    WORKERS_KILLED_TOTAL,
    ZYGOTE_RESTARTS_TOTAL,
    SESSIONS_ACTIVE,
    SESSIONS_CREATED_TOTAL,
    SESSIONS_CLOSED_TOTAL,
    SESSIONS_EXPIRED_TOTAL,
    SESSIONS_EVICTED_TOTAL,
    SESSIONS_LOST_TOTAL,
    FILES_STORED,
    FILES_STORED_BYTES,
    FILES_QUOTA_BYTES,
    WORKSPACE_BOUNDED,
    WORKSPACE_SIZE_BYTES,
    WORKSPACE_USED_BYTES,
    WORKSPACE_INODES,
    WORKSPACE_USED_INODES,
    WORKERS_MEMORY_LIMIT_BYTES,
    WORKERS_MEMORY_USED_BYTES,
    WORKERS_OOM_KILLS,
    READY,
    FILE_STORE_AVAILABLE,
    SANDBOX_LAYER_ACTIVE,
    HTTP_REQUESTS_TOTAL,
    PROCESS_RESIDENT_MEMORY_BYTES,
    BUILD_INFO,
    FILE_STORE_OPERATION_SECONDS,
    FILE_STORE_ERRORS_TOTAL,
    SESSION_FORWARDS_TOTAL,
    SESSION_FORWARD_SECONDS,
    ROLLOVERS_TOTAL,
    ROLLOVER_DURATION_SECONDS,
    GENERATION,
];

/// Tool calls made by sandboxed code (Code Mode), by `tool` (an operator tool's name, or
/// `caller` for every tool a request declared, `unknown` for names not offered),
/// `provider` (caller, http, mcp; none for a name no tool has) and `outcome` (ok, or the
/// error kind; `cancelled` also for a call whose run ended, was interrupted or cancelled,
/// or whose program cancelled it, before its answer).
pub const TOOL_CALLS_TOTAL: &str = "snakecage_tool_calls_total";
/// From a tool call reaching the supervisor to its answer (or its cancellation), by
/// `provider`.
pub const TOOL_CALL_DURATION_SECONDS: &str = "snakecage_tool_call_duration_seconds";
