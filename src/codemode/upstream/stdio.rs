//! A stdio upstream: the operator's command as a child process speaking JSON-RPC on its
//! stdin and stdout. rmcp reads its stdout through a [`LineGuard`] (messages held to the
//! limit, junk logged and dropped); its stderr is logged line by line under the server's
//! name ([`ServerLog`]). The transport keeps which requests await an answer, so that the
//! guard can tell which call an oversized message was for.

use std::collections::BTreeMap;
use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

use super::line_guard::{LineGuard, Pending};
use super::server_log::{MAX_LINE_BYTES, ServerLog};

/// How long a server may take to exit once its stdin is closed, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

pub struct ChildTransport {
    child: Child,
    rw: AsyncRwTransport<RoleClient, LineGuard<ChildStdout>, ChildStdin>,
    pending: Pending,
}

impl ChildTransport {
    /// Starts `argv` with only `env` for environment; messages over `limit` bytes are not
    /// read. The child is killed when the transport is dropped.
    pub fn spawn(
        server: &str,
        argv: &[String],
        env: &BTreeMap<String, String>,
        limit: usize,
    ) -> io::Result<Self> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an empty command"))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env_clear()
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let server: Arc<str> = server.into();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three were piped");
        };
        tokio::spawn(log_stderr(stderr, ServerLog::new(server.clone(), "stderr")));
        let pending = Pending::default();
        let stdout = LineGuard::new(
            stdout,
            limit,
            pending.clone(),
            ServerLog::new(server, "stdout"),
        );
        // The guard passes at most `limit` bytes of a line and its newline: rmcp's own
        // bound is never the one that drops a message.
        let rw = AsyncRwTransport::new_client(stdout, stdin)
            .with_max_line_length(limit.saturating_add(1));
        Ok(Self { child, rw, pending })
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        {
            let mut pending = self.pending.lock().expect("pending requests lock");
            match &item {
                ClientJsonRpcMessage::Request(request) => {
                    pending.insert(request.id.clone());
                }
                // A call given up on is answered by nobody.
                ClientJsonRpcMessage::Notification(notification) => {
                    if let ClientNotification::CancelledNotification(cancelled) =
                        &notification.notification
                        && let Some(id) = &cancelled.params.request_id
                    {
                        pending.remove(id);
                    }
                }
                _ => {}
            }
        }
        self.rw.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.rw.receive().await?;
        let answered = match &message {
            ServerJsonRpcMessage::Response(response) => Some(&response.id),
            ServerJsonRpcMessage::Error(error) => error.id.as_ref(),
            _ => None,
        };
        if let Some(id) = answered {
            self.pending
                .lock()
                .expect("pending requests lock")
                .remove(id);
        }
        Some(message)
    }

    /// Closes the server's stdin (MCP's stdio shutdown), waits a little for it to exit,
    /// then kills it.
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.rw.close().await?;
        if tokio::time::timeout(EXIT_GRACE, self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

/// Logs the server's stderr line by line until it closes.
async fn log_stderr(stderr: ChildStderr, mut log: ServerLog) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::with_capacity(MAX_LINE_BYTES);
    loop {
        line.clear();
        let read = (&mut reader)
            .take(MAX_LINE_BYTES as u64)
            .read_until(b'\n', &mut line)
            .await;
        if !matches!(read, Ok(n) if n > 0) {
            break;
        }
        let more = if line.ends_with(b"\n") {
            0
        } else {
            skip_line(&mut reader).await
        };
        log.line(&line, more);
    }
    log.finish();
}

/// Skips the rest of a line; how many bytes (its newline not counted).
async fn skip_line(reader: &mut BufReader<ChildStderr>) -> usize {
    let mut skipped = 0;
    loop {
        let Ok(available) = reader.fill_buf().await else {
            return skipped;
        };
        if available.is_empty() {
            return skipped;
        }
        let (n, ends) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        reader.consume(n);
        if ends {
            return skipped + n - 1;
        }
        skipped += n;
    }
}
