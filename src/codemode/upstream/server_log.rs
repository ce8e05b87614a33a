//! What a stdio upstream says outside the protocol (its stderr, lines on its stdout that
//! are not JSON-RPC), in snakecage's log under the server's name. Its bytes are hostile:
//! each line is cut to [`MAX_LINE_BYTES`] and logged escaped (no terminal escapes, no
//! forged log lines), and at most [`LINES_PER_WINDOW`] lines per [`WINDOW`] are logged; the
//! rest are counted, and the count is logged when the next window opens or the stream ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most bytes of one line logged; the rest are counted.
pub const MAX_LINE_BYTES: usize = 1024;

/// The most lines of one stream logged per [`WINDOW`].
const LINES_PER_WINDOW: u32 = 100;
const WINDOW: Duration = Duration::from_secs(10);

/// One stream of one server (`stderr`, or `stdout` for its non-protocol lines).
pub struct ServerLog {
    server: Arc<str>,
    stream: &'static str,
    window_start: Instant,
    logged: u32,
    suppressed: u64,
}

impl ServerLog {
    pub fn new(server: Arc<str>, stream: &'static str) -> Self {
        Self {
            server,
            stream,
            window_start: Instant::now(),
            logged: 0,
            suppressed: 0,
        }
    }

    /// Logs a line: `head` (its first bytes, at most [`MAX_LINE_BYTES`] of them are shown)
    /// and `more`, how many bytes of it were not kept.
    pub fn line(&mut self, head: &[u8], more: usize) {
        if !self.admit(Instant::now()) {
            return;
        }
        let head = head.strip_suffix(b"\n").unwrap_or(head);
        let head = head.strip_suffix(b"\r").unwrap_or(head);
        let shown = head.len().min(MAX_LINE_BYTES);
        let more = more + (head.len() - shown);
        let text = String::from_utf8_lossy(&head[..shown]);
        if more == 0 {
            tracing::info!(server = %self.server, stream = %self.stream, line = ?text, "upstream MCP server output");
        } else {
            tracing::info!(server = %self.server, stream = %self.stream, line = ?text, cut_bytes = more, "upstream MCP server output (line cut)");
        }
    }

    /// Logs a message of `bytes` bytes (at least) not read past `limit`; `answered`: the call
    /// it was for was told. Not limited: each costs the server `limit` bytes.
    pub fn oversized(&self, bytes: usize, limit: usize, answered: bool) {
        if answered {
            tracing::warn!(server = %self.server, bytes, limit, "an upstream MCP server's message was too large to read; the call it answers failed with a limit error");
        } else {
            tracing::warn!(server = %self.server, bytes, limit, "an upstream MCP server's message was too large to read, and which call it answers cannot be told; that call waits for tools.call_timeout_ms");
        }
    }

    /// Logs a message in which `replaced` byte sequences were not UTF-8 (each passed on as
    /// U+FFFD). Limited as lines are: a server can send such messages without end.
    pub fn not_utf8(&mut self, replaced: usize) {
        if !self.admit(Instant::now()) {
            return;
        }
        tracing::warn!(server = %self.server, replaced, "an upstream MCP server's message held bytes that are not UTF-8; each such sequence was read as U+FFFD");
    }

    /// Logs how many lines were not logged, if any (the stream ended).
    pub fn finish(&mut self) {
        self.report_suppressed();
    }

    /// Whether a line seen at `now` is logged, opening a new window when the last is over.
    fn admit(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window_start) >= WINDOW {
            self.report_suppressed();
            self.window_start = now;
            self.logged = 0;
        }
        if self.logged < LINES_PER_WINDOW {
            self.logged += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    fn report_suppressed(&mut self) {
        if self.suppressed > 0 {
            tracing::warn!(server = %self.server, stream = %self.stream, lines = self.suppressed, "upstream MCP server output not logged (more than {LINES_PER_WINDOW} lines in {} s)", WINDOW.as_secs());
            self.suppressed = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_logged_up_to_the_window_budget_then_counted() {
        let mut log = ServerLog::new("s".into(), "stderr");
        let start = log.window_start;
        let admitted = (0..LINES_PER_WINDOW + 50)
            .filter(|_| log.admit(start))
            .count();
        assert_eq!(admitted, LINES_PER_WINDOW as usize);
        assert_eq!(log.suppressed, 50);
        // The next window logs again, and the count was reported (reset).
        assert!(log.admit(start + WINDOW));
        assert_eq!(log.suppressed, 0);
    }
}
