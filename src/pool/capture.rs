//! Bounded capture of output: [`CappedOutput`] keeps the first `max` bytes of one stream,
//! counts and drops the rest, so a job that floods its output costs the supervisor nothing
//! but pipe reads; [`Capture`] holds both streams of a run and passes chunks on as they come.

use super::output_feed::OutputSender;
use super::run::Stream;
use super::worker::{Worker, read_nonblocking};

/// Appended to output that was cut.
pub const TRUNCATION_SUFFIX: &str = "\n...[truncated]";

/// The last `max` bytes of `text` or less, for quoting the end of a process's stderr in
/// an error: whole lines where a line ends in them (else from a character boundary),
/// after a `…` line when something was left out.
pub(super) fn last_lines(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    if let Some(newline) = text[start..].find('\n') {
        start += newline + 1;
    }
    format!("…\n{}", &text[start..])
}

#[derive(Debug)]
pub struct CappedOutput {
    buf: Vec<u8>,
    max: usize,
    dropped: u64,
}

impl CappedOutput {
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            max,
            dropped: 0,
        }
    }

    /// Keeps what fits; returns the part that was kept (for streaming it on).
    pub fn push<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        let room = self.max.saturating_sub(self.buf.len());
        let kept = &bytes[..bytes.len().min(room)];
        self.buf.extend_from_slice(kept);
        self.dropped += (bytes.len() - kept.len()) as u64;
        kept
    }

    pub fn truncated(&self) -> bool {
        self.dropped > 0
    }

    /// No byte arrived, kept or dropped.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.dropped == 0
    }

    /// The text, lossily decoded; a UTF-8 sequence cut by the limit is dropped whole, and a
    /// truncated stream ends with [`TRUNCATION_SUFFIX`].
    pub fn into_string(self) -> String {
        let mut bytes = self.buf;
        if self.dropped > 0
            && let Err(e) = std::str::from_utf8(&bytes)
            && e.error_len().is_none()
        {
            bytes.truncate(e.valid_up_to());
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if self.dropped > 0 {
            text.push_str(TRUNCATION_SUFFIX);
        }
        text
    }
}

/// Both output streams of one run: capped, and passed on as they come when someone
/// listens (streaming), without waiting for the listener (see [`super::output_feed`]).
pub(super) struct Capture {
    pub(super) stdout: CappedOutput,
    pub(super) stderr: CappedOutput,
    pub(super) stdout_open: bool,
    pub(super) stderr_open: bool,
    /// Tool calls the worker made (Code Mode): each reached the host.
    pub(super) tool_calls: usize,
    chunks: Option<OutputSender>,
}

impl Capture {
    pub(super) fn new(max: usize, chunks: Option<OutputSender>) -> Self {
        Self {
            stdout: CappedOutput::new(max),
            stderr: CappedOutput::new(max),
            stdout_open: true,
            stderr_open: true,
            tool_calls: 0,
            chunks,
        }
    }

    pub(super) fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let out = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        let was_truncated = out.truncated();
        let kept = out.push(bytes);
        // The listener reads the cut where the result has it: its chunks add up to the
        // result's text, the mark included.
        let cut = !was_truncated && out.truncated();
        let Some(tx) = &self.chunks else {
            return;
        };
        // A gone listener (client disconnected) is the caller's business, not ours.
        tx.send(stream, kept);
        if cut {
            tx.send(stream, TRUNCATION_SUFFIX.as_bytes());
        }
    }

    /// Reads whatever is already in the pipes, without waiting for more.
    pub(super) fn drain(&mut self, worker: &Worker, buf: &mut [u8]) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let (fd, open) = match stream {
                Stream::Stdout => (&worker.stdout, self.stdout_open),
                Stream::Stderr => (&worker.stderr, self.stderr_open),
            };
            if !open {
                continue;
            }
            loop {
                match read_nonblocking(fd, buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => self.push(stream, &buf[..n]),
                }
            }
        }
    }

    pub(super) fn truncated(&self) -> bool {
        self.stdout.truncated() || self.stderr.truncated()
    }

    /// Whether anything of the run reached the outside: a byte of output (kept or cut) or
    /// a tool call. Call after [`Capture::drain`].
    pub(super) fn anything_came_out(&self) -> bool {
        !self.stdout.is_empty() || !self.stderr.is_empty() || self.tool_calls > 0
    }
}

pub(super) trait Finish {
    fn finish(self) -> (String, bool);
}

impl Finish for CappedOutput {
    fn finish(self) -> (String, bool) {
        let truncated = self.truncated();
        (self.into_string(), truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_tail_starts_at_a_line_and_says_it_was_cut() {
        assert_eq!(last_lines("short\ntext", 100), "short\ntext");
        let text = "Traceback:\n  File \"/x/polars/_cpu_check.py\", line 1\nImportError: ü";
        assert_eq!(
            last_lines(text, 30),
            "…\nImportError: ü",
            "whole lines only"
        );
        // No line ends in the tail: cut at a character boundary, still marked.
        assert_eq!(last_lines("ééééé", 5), "…\néé");
    }

    #[test]
    fn output_under_the_limit_is_kept_whole() {
        let mut c = CappedOutput::new(10);
        assert_eq!(c.push(b"hello"), b"hello");
        assert!(!c.truncated());
        assert_eq!(c.into_string(), "hello");
    }

    #[test]
    fn output_over_the_limit_is_cut_and_marked() {
        let mut c = CappedOutput::new(4);
        assert_eq!(c.push(b"abc"), b"abc");
        assert_eq!(c.push(b"defgh"), b"d");
        assert_eq!(c.push(b"ijk"), b"");
        assert!(c.truncated());
        assert_eq!(c.into_string(), "abcd\n...[truncated]");
    }

    #[test]
    fn a_multibyte_character_cut_by_the_limit_is_dropped_not_mangled() {
        let mut c = CappedOutput::new(4);
        c.push("abcé".as_bytes()); // é is two bytes: only the first fits
        assert_eq!(c.into_string(), "abc\n...[truncated]");
    }
}
