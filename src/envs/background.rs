//! The host processes a package change runs (uv, the bytecode compiler): argument vectors
//! (never a shell), an environment of `PATH` alone unless the caller adds to it, the
//! lowest CPU priority, a deadline, and bounded output.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// The most of a process's stdout or stderr kept (uv's messages are a few lines; a
/// resolver explanation may be a few dozen; the compiler answers one line).
const MAX_OUTPUT: usize = 16 << 10;

/// A process that ran to its end.
pub(super) struct Finished {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

pub(super) enum RunError {
    TimedOut,
    Spawn(std::io::Error),
}

/// `program` with a clean environment, stdin closed, its output captured, killed when
/// dropped, at niceness 19.
pub(super) fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A change is background work beside live requests: compiling bytecode keeps every
    // CPU busy for as long as it runs. The process and those it starts inherit the lowest
    // niceness.
    // SAFETY: between fork and exec only `setpriority`, a plain system call, runs.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            Ok(())
        });
    }
    cmd
}

/// Runs `cmd` to its end, or kills it after `timeout`.
pub(super) async fn run(mut cmd: Command, timeout: Duration) -> Result<Finished, RunError> {
    let child = cmd.spawn().map_err(RunError::Spawn)?;
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| RunError::TimedOut)?
        .map_err(RunError::Spawn)?;
    Ok(Finished {
        success: output.status.success(),
        stdout: bounded(&output.stdout),
        stderr: bounded(&output.stderr),
    })
}

fn bounded(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_OUTPUT)]);
    text.trim().to_owned()
}
