//! Bounded capture of output: [`CappedOutput`] keeps the head and the tail of one stream
//! within `max` bytes, counts and drops its middle, so a job that floods its output costs
//! the supervisor nothing but pipe reads and still shows how it ended; [`Capture`] holds
//! both streams of a run and passes chunks on as they come.

use std::collections::VecDeque;

use super::output_feed::OutputSender;
use super::run::Stream;
use super::worker::{Worker, read_nonblocking};

/// Put between the head and the tail of output that was cut, with the count of the bytes
/// left out between them.
pub fn truncation_mark(left_out: u64) -> String {
    format!("\n...[{left_out} bytes truncated]...\n")
}

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

/// Where `bytes` ends short of a UTF-8 sequence that the end cuts in half: before its
/// first byte; else at its end.
fn before_a_cut_character(bytes: &[u8]) -> usize {
    let end = bytes.len();
    for back in 1..=end.min(4) {
        let byte = bytes[end - back];
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: its lead is further back
        }
        let len = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if len > back { end - back } else { end };
    }
    end
}

/// One stream of a run, within `max` bytes: output up to `max` bytes is kept whole, byte
/// for byte; past it, its first `max / 2` bytes (the head) and its last `max - max / 2`
/// (the tail) are kept and the middle is dropped and counted, so the end of a long
/// output (the answer after a progress bar, a traceback after a flood) survives. Both
/// cuts fall between characters: a UTF-8 sequence the head's end would cut in half goes
/// to the tail, one the tail's start cuts is left out with the middle.
///
/// Bytes reach the listener as they come while they belong to the head; the rest only at
/// [`CappedOutput::finish`], once it is known whether they are kept whole or cut: what the
/// listener gets adds up to the text the result has.
#[derive(Debug)]
pub struct CappedOutput {
    head: Vec<u8>,
    head_max: usize,
    /// The head is complete: later bytes go to the tail.
    head_closed: bool,
    /// The head's bytes handed to the listener so far.
    head_sent: usize,
    /// The latest bytes after the head, at most `tail_max`.
    tail: VecDeque<u8>,
    tail_max: usize,
    /// Bytes that left the tail at its front: the middle that is cut.
    dropped: u64,
}

impl CappedOutput {
    pub fn new(max: usize) -> Self {
        Self {
            head: Vec::new(),
            head_max: max / 2,
            head_closed: false,
            head_sent: 0,
            tail: VecDeque::new(),
            tail_max: max - max / 2,
            dropped: 0,
        }
    }

    /// Keeps `bytes` (the tail dropping its oldest to stay within its room); returns what
    /// can be passed on to a listener now: the head's bytes not passed on yet, short of a
    /// character still incomplete.
    pub fn push(&mut self, mut bytes: &[u8]) -> &[u8] {
        if !self.head_closed {
            let room = self.head_max - self.head.len();
            if bytes.len() <= room {
                self.head.extend_from_slice(bytes);
                bytes = &[];
            } else {
                self.head.extend_from_slice(&bytes[..room]);
                bytes = &bytes[room..];
                // The head ends between characters; a character cut in half starts the tail.
                let end = before_a_cut_character(&self.head);
                self.tail.extend(self.head.drain(end..));
                self.head_closed = true;
            }
        }
        self.keep_in_tail(bytes);
        let ready = if self.head_closed {
            self.head.len()
        } else {
            before_a_cut_character(&self.head)
        };
        let sent = self.head_sent;
        self.head_sent = ready.max(sent);
        &self.head[sent..self.head_sent]
    }

    fn keep_in_tail(&mut self, bytes: &[u8]) {
        if bytes.len() >= self.tail_max {
            self.dropped += (self.tail.len() + bytes.len() - self.tail_max) as u64;
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_max..]);
            return;
        }
        self.tail.extend(bytes);
        let over = self.tail.len().saturating_sub(self.tail_max);
        if over > 0 {
            self.tail.drain(..over);
            self.dropped += over as u64;
        }
    }

    pub fn truncated(&self) -> bool {
        self.dropped > 0
    }

    /// No byte arrived, kept or dropped.
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty() && self.dropped == 0
    }

    /// The bytes kept after the head, as the result has them: all of them when nothing
    /// was cut; else the mark and the tail from its first whole character.
    fn rest(&mut self) -> Vec<u8> {
        let tail = self.tail.make_contiguous();
        if self.dropped == 0 {
            return tail.to_vec();
        }
        let start = tail
            .iter()
            .take(3)
            .take_while(|&&b| b & 0xC0 == 0x80)
            .count();
        let left_out = self.dropped + start as u64;
        let mut rest = truncation_mark(left_out).into_bytes();
        rest.extend_from_slice(&tail[start..]);
        rest
    }

    /// The text, lossily decoded, and whether it was cut; what the listener has not had
    /// yet is sent to `listener` first, so that its bytes add up to the same text.
    pub fn finish(mut self, listener: Option<(&OutputSender, Stream)>) -> (String, bool) {
        let rest = self.rest();
        if let Some((tx, stream)) = listener {
            tx.send(stream, &self.head[self.head_sent..]);
            tx.send(stream, &rest);
        }
        let truncated = self.truncated();
        let text = if truncated {
            // Head and rest each hold whole characters: decoded apart, as the listener's
            // decoder sees them (the mark is ASCII).
            let mut text = String::from_utf8_lossy(&self.head).into_owned();
            text.push_str(&String::from_utf8_lossy(&rest));
            text
        } else {
            let mut bytes = self.head;
            bytes.extend_from_slice(&rest);
            String::from_utf8(bytes)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
        };
        (text, truncated)
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

/// A stream's text as the result has it, and whether it was cut.
pub(super) type Captured = (String, bool);

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
        let ready = out.push(bytes);
        // A gone listener (client disconnected) is the caller's business, not ours.
        if let Some(tx) = &self.chunks {
            tx.send(stream, ready);
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

    /// Both streams as the result has them; a listener gets what it has not had yet first.
    pub(super) fn finish(self) -> (Captured, Captured) {
        let listener = |stream| self.chunks.as_ref().map(|tx| (tx, stream));
        let stdout = self.stdout.finish(listener(Stream::Stdout));
        let stderr = self.stderr.finish(listener(Stream::Stderr));
        (stdout, stderr)
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

    /// Pushes `pieces` into a capture of `max` bytes with a listener; returns the result's
    /// text, whether it was cut, and what the listener got (decoded as a whole).
    fn capture(max: usize, pieces: &[&[u8]]) -> (String, bool, String) {
        let (tx, mut rx) = super::super::output_feed::output_feed();
        let mut c = CappedOutput::new(max);
        let mut heard = Vec::new();
        for piece in pieces {
            tx.send(Stream::Stdout, c.push(piece));
        }
        let (text, truncated) = c.finish(Some((&tx, Stream::Stdout)));
        drop(tx);
        while let Some(chunk) =
            futures_util::FutureExt::now_or_never(rx.recv()).expect("the feed has ended")
        {
            assert_eq!(chunk.stream, Stream::Stdout);
            heard.extend(chunk.data);
        }
        (
            text,
            truncated,
            String::from_utf8_lossy(&heard).into_owned(),
        )
    }

    #[test]
    fn output_up_to_the_limit_is_kept_whole_byte_for_byte() {
        let (text, truncated, heard) = capture(10, &[b"hello", b"w\xc3\xb6rl"]);
        assert_eq!((text.as_str(), truncated), ("hellowörl", false));
        assert_eq!(heard, text);
        // Not even valid UTF-8 is touched beyond the lossy decoding.
        let (text, truncated, _) = capture(10, &[b"ab\xff"]);
        assert_eq!((text.as_str(), truncated), ("ab\u{fffd}", false));
    }

    #[test]
    fn output_past_the_limit_keeps_its_head_and_its_end_and_says_how_much_went() {
        let (text, truncated, heard) = capture(8, &[b"abc", b"defgh", b"ijklmnop"]);
        assert!(truncated);
        assert_eq!(text, "abcd\n...[8 bytes truncated]...\nmnop");
        assert_eq!(heard, text);
        // One byte over is a cut too.
        let (text, truncated, _) = capture(8, &[b"abcdefghi"]);
        assert_eq!(
            (text.as_str(), truncated),
            ("abcd\n...[1 bytes truncated]...\nfghi", true)
        );
    }

    /// A program that draws a progress bar fast and then prints its answer: the answer
    /// is at the end of the result, and the head, the count and the tail add up to all
    /// that was written.
    #[test]
    fn the_answer_after_a_flood_of_progress_updates_survives_the_cut() {
        let updates: Vec<String> = (0..200_000).map(|i| format!("\r{i:>6}/200000")).collect();
        let mut pieces: Vec<&[u8]> = updates.iter().map(|u| u.as_bytes()).collect();
        pieces.push(b"\nthe answer is 42\n");
        let written: usize = pieces.iter().map(|p| p.len()).sum();
        let (text, truncated, heard) = capture(4096, &pieces);
        assert!(truncated);
        assert!(
            text.starts_with("\r     0/200000\r     1/200000"),
            "{text:.80}"
        );
        assert!(
            text.ends_with("\r199999/200000\nthe answer is 42\n"),
            "{text}"
        );
        assert_eq!(heard, text);
        let (head, rest) = text.split_once("\n...[").unwrap();
        let (count, tail) = rest.split_once(" bytes truncated]...\n").unwrap();
        assert_eq!((head.len(), tail.len()), (2048, 2048));
        assert_eq!(
            head.len() + count.parse::<usize>().unwrap() + tail.len(),
            written
        );
    }

    /// Both cuts fall between characters, whichever way the bytes arrive (here one by
    /// one, so a character is split across reads everywhere): the listener never gets
    /// half a character, and the count says how many bytes went.
    #[test]
    fn neither_cut_splits_a_character() {
        // "aaa" then é×5 (two bytes each), "z", "ü": 16 bytes. The head's four bytes would
        // end inside the first é, the tail's four start inside the last.
        let text = format!("aaa{}zü", "é".repeat(5));
        let bytes: Vec<&[u8]> = text.as_bytes().chunks(1).collect();
        let (got, truncated, heard) = capture(8, &bytes);
        assert!(truncated);
        assert_eq!(got, "aaa\n...[10 bytes truncated]...\nzü");
        assert_eq!(heard, got);
        // Four-byte characters, cut by a head of 5 and a tail of 6 bytes.
        let text = "😀".repeat(8);
        let (got, _, heard) = capture(11, &[text.as_bytes()]);
        assert_eq!(got, "😀\n...[24 bytes truncated]...\n😀");
        assert_eq!(heard, got);
    }

    #[test]
    fn what_the_listener_gets_as_it_comes_is_only_the_head() {
        let mut c = CappedOutput::new(8);
        assert_eq!(c.push(b"ab"), b"ab");
        // The first byte of a character is held until the character is whole.
        assert_eq!(c.push(b"\xc3"), b"");
        assert_eq!(c.push(b"\xa9x"), "é".as_bytes());
        // Past the head: nothing until the end, when it is known whether it is cut.
        assert_eq!(c.push(b"yz"), b"");
        assert!(!c.truncated());
    }
}
