//! The hostile-fixture machinery every attack family shares: a fixture (a program and what
//! the user must see), the exact denial messages of each layer, and the runner that checks
//! each fixture against a live service.

use serde_json::json;

use crate::harness::Server;

/// Every layer: the hostile suite refuses to run on a host where one is missing.
pub(crate) const ALL_LAYERS: &str = r#"["network_namespace", "mount_namespace", "rlimits", "drop_privileges", "no_new_privs", "landlock", "seccomp", "audit_hook", "import_guard", "cgroup"]"#;
pub(crate) const OS_LAYERS: &str = r#"["network_namespace", "mount_namespace", "rlimits", "drop_privileges", "no_new_privs", "landlock", "seccomp", "cgroup"]"#;
/// The ids a test server's workers run under (each its own): the block an unset
/// `sandbox.uid` takes is in here.
pub(super) const WORKER_UIDS: std::ops::RangeInclusive<u32> = 40_000..=59_999;
/// The gid every worker drops to by default.
pub(super) const WORKER_GID: u32 = 65534;

/// One hostile program and what the user must see.
pub(crate) struct Fixture {
    pub(super) name: &'static str,
    pub(super) code: String,
    pub(super) timeout_ms: Option<u64>,
    pub(super) expect: Expect,
}

pub(super) enum Expect {
    /// An uncaught exception: exit code 1, verdict error, this last stderr line.
    Denied(String),
    /// Ran to the end (it caught the denial itself) and printed exactly this.
    Prints(String),
    /// The worker died (e.g. SIGSEGV): verdict killed, no exit code.
    Killed,
    /// Killed at its deadline.
    TimedOut,
}

pub(super) fn denied(
    name: &'static str,
    code: impl Into<String>,
    last_line: impl Into<String>,
) -> Fixture {
    Fixture {
        name,
        code: code.into(),
        timeout_ms: None,
        expect: Expect::Denied(last_line.into()),
    }
}

pub(super) fn prints(
    name: &'static str,
    code: impl Into<String>,
    stdout: impl Into<String>,
) -> Fixture {
    Fixture {
        name,
        code: code.into(),
        timeout_ms: None,
        expect: Expect::Prints(stdout.into()),
    }
}

pub(super) fn audit(event: &str) -> String {
    format!("PermissionError: '{event}' is not allowed in this sandbox")
}

pub(super) fn import_denied(module: &str) -> String {
    format!("ImportError: import of '{module}' is not allowed in this sandbox")
}

pub(super) fn write_denied(path: &str) -> String {
    format!(
        "PermissionError: 'open' for writing outside the workspace is not allowed in this sandbox: \"{path}\""
    )
}

pub(super) const EPERM: &str = "PermissionError: [Errno 1] Operation not permitted";

pub(super) fn eacces(path: &str) -> String {
    format!("PermissionError: [Errno 13] Permission denied: '{path}'")
}

/// Runs every fixture and returns one message per fixture that was not stopped as expected.
pub(crate) async fn run_fixtures(s: &Server, fixtures: Vec<Fixture>) -> Vec<String> {
    let mut failures = Vec::new();
    for f in fixtures {
        let mut body = json!({ "code": f.code });
        if let Some(ms) = f.timeout_ms {
            body["timeout_ms"] = json!(ms);
        }
        let (status, r) = s.post("/v1/execute", &body).await;
        if status != 200 {
            failures.push(format!(
                "{}: HTTP {status} (a denial must be a result): {r}",
                f.name
            ));
            continue;
        }
        let stderr = r["stderr"].as_str().unwrap_or_default();
        let last = stderr.trim_end().lines().last().unwrap_or_default();
        let ok = match &f.expect {
            Expect::Denied(line) => {
                r["exit_code"] == 1 && r["verdict"] == "error" && last == line.as_str()
            }
            Expect::Prints(out) => r["exit_code"] == 0 && r["stdout"] == out.as_str(),
            Expect::Killed => r["verdict"] == "killed" && r["exit_code"].is_null(),
            Expect::TimedOut => r["verdict"] == "timeout" && r["timed_out"] == true,
        };
        if !ok {
            let want = match &f.expect {
                Expect::Denied(line) => format!("exit 1, stderr ending {line:?}"),
                Expect::Prints(out) => format!("exit 0, stdout {out:?}"),
                Expect::Killed => "verdict killed".into(),
                Expect::TimedOut => "verdict timeout".into(),
            };
            failures.push(format!(
                "{}: expected {want}; got verdict {} exit {} stdout {:?} stderr {:?}",
                f.name, r["verdict"], r["exit_code"], r["stdout"], stderr
            ));
        }
    }
    failures
}
