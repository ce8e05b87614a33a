//! The stdout of a stdio upstream as rmcp reads it: one JSON-RPC message a line, checked
//! line by line before rmcp parses it.
//!
//! - A line that does not start as a JSON object (after blanks) is not a message: it is
//!   logged under the server's name ([`ServerLog`]) and dropped.
//! - A message longer than the limit is not read past it: what rmcp has of it is ended
//!   (an unparsable line, which it skips), the rest dropped, and the call it answers gets
//!   [`too_large::answer`] instead. That call is the request whose `id` the line gives
//!   before the limit (the official SDKs write `id` before `result`), or else, unless a
//!   `method` shows it is the server's own request or notification, the only request
//!   awaiting an answer. When neither tells (several requests in flight, the `id` after
//!   the cut), no call can be answered: it waits for `tools.call_timeout_ms`.
//! - A message's bytes that are not UTF-8 are passed on as U+FFFD, each sequence of them
//!   (logged): rmcp drops a line that is not UTF-8 without a word, and the call it
//!   answers would wait for `tools.call_timeout_ms`. An HTTP tool's answer is read the
//!   same way.

use std::collections::HashSet;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use rmcp::model::RequestId;
use serde::Deserializer as _;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use tokio::io::{AsyncRead, ReadBuf};

use super::server_log::{MAX_LINE_BYTES, ServerLog};
use super::too_large;

/// The requests sent to the server and not answered yet (kept by the transport).
pub type Pending = Arc<Mutex<HashSet<RequestId>>>;

/// Bytes of a line kept to tell what it is (and to log it, if it is not a message).
const HEAD_BYTES: usize = MAX_LINE_BYTES;

/// How much is read from the server at once.
const READ_BYTES: usize = 8 << 10;

pub struct LineGuard<R> {
    inner: R,
    scratch: Box<[u8]>,
    lines: Lines,
}

impl<R> LineGuard<R> {
    /// Reads `inner`, passing on lines of at most `limit` bytes (newline included).
    pub fn new(inner: R, limit: usize, pending: Pending, log: ServerLog) -> Self {
        Self {
            inner,
            scratch: vec![0; READ_BYTES].into_boxed_slice(),
            lines: Lines::new(limit, pending, log),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineGuard<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.lines.drain_into(buf) {
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The end of the stream; a line it cut short is not a message.
                return Poll::Ready(Ok(()));
            }
            this.lines.feed(read.filled());
        }
    }
}

/// What the line being read is, once its head shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Undecided,
    Message,
    Junk,
    Oversized,
}

/// The state of the line being read, and what is ready to be passed on.
struct Lines {
    limit: usize,
    pending: Pending,
    log: ServerLog,
    kind: Kind,
    /// The first [`HEAD_BYTES`] of the line.
    head: Vec<u8>,
    /// Bytes of the line seen, and passed on.
    seen: usize,
    passed: usize,
    /// The start of a UTF-8 sequence the bytes passed on so far end with (its rest is in
    /// the next read), and how many sequences of the message were not UTF-8.
    partial: Vec<u8>,
    replaced: usize,
    out: Vec<u8>,
    out_at: usize,
}

impl Lines {
    fn new(limit: usize, pending: Pending, log: ServerLog) -> Self {
        Self {
            limit,
            pending,
            log,
            kind: Kind::Undecided,
            head: Vec::with_capacity(HEAD_BYTES),
            seen: 0,
            passed: 0,
            partial: Vec::new(),
            replaced: 0,
            out: Vec::new(),
            out_at: 0,
        }
    }

    /// Moves what is ready into `buf`; false when nothing is.
    fn drain_into(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        if self.out_at == self.out.len() {
            return false;
        }
        let n = (self.out.len() - self.out_at).min(buf.remaining());
        buf.put_slice(&self.out[self.out_at..self.out_at + n]);
        self.out_at += n;
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
        }
        true
    }

    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let end = data.iter().position(|&b| b == b'\n').map(|at| at + 1);
            let (part, rest) = data.split_at(end.unwrap_or(data.len()));
            data = rest;
            self.take(part, end.is_some());
        }
    }

    /// Takes `part` of the line (its end, with the newline, when `ends`).
    fn take(&mut self, part: &[u8], ends: bool) {
        let kept = (HEAD_BYTES - self.head.len()).min(part.len());
        self.head.extend_from_slice(&part[..kept]);
        self.seen += part.len();
        match self.kind {
            Kind::Undecided if ends || self.head.len() == HEAD_BYTES => {
                if starts_as_object(&self.head) {
                    self.kind = Kind::Message;
                    let head = std::mem::take(&mut self.head);
                    self.pass(&head);
                    self.head = head;
                    self.pass(&part[kept..]);
                } else {
                    self.kind = Kind::Junk;
                }
            }
            Kind::Message => self.pass(part),
            Kind::Undecided | Kind::Junk | Kind::Oversized => {}
        }
        if ends {
            self.end_line();
        }
    }

    /// Passes on bytes of a message, unless they take it past the limit.
    fn pass(&mut self, bytes: &[u8]) {
        if self.kind != Kind::Message {
            return;
        }
        if self.passed + bytes.len() > self.limit {
            self.kind = Kind::Oversized;
            self.partial.clear();
            if self.passed > 0 {
                // What rmcp holds of the line ends here: a line it cannot parse, and skips.
                self.out.push(b'\n');
            }
            return;
        }
        self.passed += bytes.len();
        self.pass_utf8(bytes);
    }

    /// Passes on `bytes` as UTF-8: each sequence that is not becomes U+FFFD; one cut at
    /// the end waits for the rest.
    fn pass_utf8(&mut self, bytes: &[u8]) {
        let joined;
        let mut data = if self.partial.is_empty() {
            bytes
        } else {
            joined = [std::mem::take(&mut self.partial).as_slice(), bytes].concat();
            &joined[..]
        };
        loop {
            match std::str::from_utf8(data) {
                Ok(_) => {
                    self.out.extend_from_slice(data);
                    return;
                }
                Err(e) => {
                    let (good, rest) = data.split_at(e.valid_up_to());
                    self.out.extend_from_slice(good);
                    match e.error_len() {
                        Some(bad) => {
                            self.out.extend_from_slice("\u{FFFD}".as_bytes());
                            self.replaced += 1;
                            data = &rest[bad..];
                        }
                        None => {
                            self.partial = rest.to_vec();
                            return;
                        }
                    }
                }
            }
        }
    }

    fn end_line(&mut self) {
        if !self.partial.is_empty() {
            // The line ended inside a sequence (the newline is passed on after it).
            self.partial.clear();
            self.out.extend_from_slice("\u{FFFD}".as_bytes());
            self.replaced += 1;
        }
        if self.replaced > 0 {
            self.log.not_utf8(std::mem::take(&mut self.replaced));
        }
        match self.kind {
            Kind::Junk => {
                let more = self.seen - self.head.len();
                self.log.line(&self.head, more);
            }
            Kind::Oversized => self.answer_oversized(),
            Kind::Undecided | Kind::Message => {}
        }
        self.kind = Kind::Undecided;
        self.head.clear();
        self.seen = 0;
        self.passed = 0;
    }

    fn answer_oversized(&mut self) {
        let pending = self.pending.lock().expect("pending requests lock");
        let id = match probe(&self.head) {
            Head { id: Some(id), .. } => pending.contains(&id).then_some(id),
            Head { method: false, .. } if pending.len() == 1 => pending.iter().next().cloned(),
            Head { .. } => None,
        };
        drop(pending);
        let Some(id) = id else {
            self.log.oversized(self.seen, self.limit, false);
            return;
        };
        self.log.oversized(self.seen, self.limit, true);
        let answer = serde_json::to_vec(&too_large::answer(id, self.limit))
            .expect("a JSON-RPC error serializes");
        self.out.extend_from_slice(&answer);
        self.out.push(b'\n');
    }
}

/// Whether a line's first bytes start a JSON object (after a byte-order mark and blanks),
/// or are all blank (an empty line rmcp skips).
fn starts_as_object(head: &[u8]) -> bool {
    let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    head.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_none_or(|&b| b == b'{')
}

/// What the first bytes of a message show of it.
#[derive(Debug, Default, PartialEq)]
struct Head {
    /// Its top-level `id`, if it comes before they end.
    id: Option<RequestId>,
    /// A `method` came first: a request or notification of the server's, not an answer.
    method: bool,
}

/// Reads the top-level `id` (and whether a `method` precedes it) of a message from its
/// first bytes, with serde_json skipping the values between (nothing of them is kept).
fn probe(head: &[u8]) -> Head {
    struct Probe<'a>(&'a mut Head);

    impl<'de> Visitor<'de> for Probe<'_> {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC message")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'_, str>>()? {
                match &*key {
                    "id" => {
                        self.0.id = Some(map.next_value()?);
                        return Ok(());
                    }
                    "method" => self.0.method = true,
                    _ => {}
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let mut found = Head::default();
    // The head is cut short: the parse fails at its end, after the id if the id is there.
    let _ = serde_json::Deserializer::from_slice(head).deserialize_map(Probe(&mut found));
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;
    use tokio::io::AsyncReadExt;

    fn lines(limit: usize, pending: &[i64]) -> Lines {
        let pending: HashSet<RequestId> =
            pending.iter().map(|&n| NumberOrString::Number(n)).collect();
        Lines::new(
            limit,
            Arc::new(Mutex::new(pending)),
            ServerLog::new("s".into(), "stdout"),
        )
    }

    /// Everything `input` yields, fed one byte at a time (the slowest reader).
    fn byte_by_byte(mut lines: Lines, input: &[u8]) -> String {
        for b in input {
            lines.feed(std::slice::from_ref(b));
        }
        String::from_utf8(std::mem::take(&mut lines.out)).unwrap()
    }

    fn answered(out: &str) -> Vec<(RequestId, usize)> {
        out.lines()
            .filter_map(|l| serde_json::from_str::<rmcp::model::ServerJsonRpcMessage>(l).ok())
            .filter_map(|m| match m {
                rmcp::model::ServerJsonRpcMessage::Error(e) => {
                    Some((e.id?, too_large::limit_of(&e.error)?))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn messages_pass_whole_and_junk_lines_are_dropped() {
        let input = b"{\"id\":1}\nnot json-rpc\n\xff\xfe\n  {\"id\":2}\r\n\n";
        let out = byte_by_byte(lines(100, &[]), input);
        assert_eq!(out, "{\"id\":1}\n  {\"id\":2}\r\n\n");
    }

    #[test]
    fn a_message_with_bytes_that_are_not_utf8_passes_with_each_sequence_replaced() {
        // A lone byte, a sequence cut by the next character, and a whole multibyte
        // character fed one byte at a time (valid: passed as it is).
        let input: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"\xff\xfe \xe2\x82 \xe2\x82\xac\"}]}}\n{\"id\":2}\n";
        let out = byte_by_byte(lines(1000, &[1, 2]), input);
        assert_eq!(
            out,
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"\u{FFFD}\u{FFFD} \u{FFFD} \u{20AC}\"}]}}\n{\"id\":2}\n"
        );
        let message: rmcp::model::ServerJsonRpcMessage =
            serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert!(matches!(
            message,
            rmcp::model::ServerJsonRpcMessage::Response(_)
        ));
        // Fed whole, the same.
        let mut whole = lines(1000, &[1, 2]);
        whole.feed(input);
        assert_eq!(String::from_utf8(whole.out).unwrap(), out);
    }

    #[test]
    fn an_oversized_message_is_answered_by_the_id_it_gives_first() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":\"{}\"}}\n",
            "b".repeat(5000)
        );
        let input = format!("{big}{{\"id\":3}}\n");
        let out = byte_by_byte(lines(2000, &[3, 7]), input.as_bytes());
        // What was passed of it is ended (rmcp skips it), call 7 is answered, the next
        // message passes.
        let mut got = out.lines();
        assert!(
            got.next()
                .unwrap()
                .starts_with("{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":\"bbb")
        );
        assert_eq!(answered(&out), [(NumberOrString::Number(7), 2000)]);
        assert!(out.ends_with("\n{\"id\":3}\n"), "{out}");
    }

    #[test]
    fn an_oversized_message_with_its_id_last_answers_the_only_request_waiting() {
        let big = format!(
            "{{\"result\":\"{}\",\"jsonrpc\":\"2.0\",\"id\":9}}\n",
            "b".repeat(5000)
        );
        let out = byte_by_byte(lines(2000, &[9]), big.as_bytes());
        assert_eq!(answered(&out), [(NumberOrString::Number(9), 2000)]);
        // With two waiting, which one it answers cannot be told: none is answered.
        let out = byte_by_byte(lines(2000, &[9, 10]), big.as_bytes());
        assert_eq!(answered(&out), []);
    }

    #[test]
    fn an_id_no_request_is_waiting_for_is_not_answered() {
        let big = format!("{{\"id\":4,\"result\":\"{}\"}}\n", "b".repeat(5000));
        let out = byte_by_byte(lines(2000, &[5]), big.as_bytes());
        assert_eq!(answered(&out), []);
        // Nor is a notification of the server's taken for the answer of the one call.
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":\"{}\"}}\n",
            "b".repeat(5000)
        );
        let out = byte_by_byte(lines(2000, &[5]), big.as_bytes());
        assert_eq!(answered(&out), []);
    }

    #[test]
    fn a_message_exactly_at_the_limit_passes() {
        let message = b"{\"id\":1,\"result\":\"xx\"}\n";
        let out = byte_by_byte(lines(message.len(), &[1]), message);
        assert_eq!(out.as_bytes(), message);
        let out = byte_by_byte(lines(message.len() - 1, &[1]), message);
        assert_eq!(
            answered(&out),
            [(NumberOrString::Number(1), message.len() - 1)]
        );
    }

    #[tokio::test]
    async fn the_guard_reads_through_to_the_end_of_its_input() {
        let input: &[u8] = b"junk\n{\"id\":1}\n{\"id\":2}";
        let mut guard = LineGuard::new(
            input,
            100,
            Pending::default(),
            ServerLog::new("s".into(), "stdout"),
        );
        let mut out = String::new();
        guard.read_to_string(&mut out).await.unwrap();
        // The stream ended inside the last line: not a whole message, not passed on.
        assert_eq!(out, "{\"id\":1}\n");
    }
}
