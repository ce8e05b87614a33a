//! The bound on the size of one tool result. An MCP client reads a call's answer as one
//! server-sent event, and the official Python SDK refuses an event over 1 MiB: `mcp`
//! 2.3.0's `DEFAULT_MAX_SSE_EVENT_SIZE = 1024 * 1024` (`mcp/client/streamable_http.py`),
//! enforced by httpx2's `EventSource` ("Server-sent event exceeded the 1048576 byte
//! limit"). A larger answer reaches the model as no answer at all, so every result is kept
//! well under it. Sizes are those of the JSON text as sent, escapes included (a control
//! character takes six bytes), measured by serialising with `serde_json`.

use std::io;

use serde::Serialize;

/// The SSE event limit of the official Python SDK (see the module's documentation).
pub const SSE_EVENT_LIMIT: usize = 1 << 20;

/// The most a tool result's JSON takes: the rest of [`SSE_EVENT_LIMIT`] is left for the
/// JSON-RPC envelope and the SSE framing, with room to spare for clients stricter still.
pub const RESULT_BUDGET: usize = SSE_EVENT_LIMIT / 4 * 3;

/// The JSON size of `value` as `serde_json` writes it (compact).
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut count = Count(0);
    // Writing to a counter cannot fail, and these values (strings, content) always serialise.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The bytes one character takes inside a JSON string.
fn char_len(c: char) -> usize {
    let mut buf = [0u8; 4];
    // Less the two quotes around it.
    json_len(c.encode_utf8(&mut buf) as &str) - 2
}

struct Count(usize);

impl io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `text` whole if its JSON takes at most `budget` bytes; otherwise its head and its tail,
/// each cut at a line's end where one is near, with `note(characters cut)` on a line of its
/// own between them, the whole taking at most `budget` bytes of JSON.
pub fn head_and_tail(text: &str, budget: usize, note: impl Fn(usize) -> String) -> String {
    if json_len(text) <= budget {
        return text.to_owned();
    }
    let total = text.chars().count();
    // The note's own size at its longest (the most characters it can name).
    let room = budget.saturating_sub(json_len(&note(total)) + json_len("\n\n") - 2);
    let head = prefix_within(text, room / 2);
    let tail = suffix_within(&text[head.len()..], room / 2);
    let cut = total - head.chars().count() - tail.chars().count();
    format!("{head}\n{}\n{tail}", note(cut))
}

/// The longest prefix of `text` within `budget` bytes of JSON, ending after a newline when
/// one is in its second half.
fn prefix_within(text: &str, budget: usize) -> &str {
    let mut used = 0;
    let mut end = 0;
    for (i, c) in text.char_indices() {
        used += char_len(c);
        if used > budget {
            break;
        }
        end = i + c.len_utf8();
    }
    let head = &text[..end];
    match head.rfind('\n') {
        Some(nl) if nl + 1 >= end / 2 => &head[..=nl],
        _ => head,
    }
}

/// The longest suffix of `text` within `budget` bytes of JSON, starting after a newline
/// when one is in its first half.
fn suffix_within(text: &str, budget: usize) -> &str {
    let mut used = 0;
    let mut start = text.len();
    for (i, c) in text.char_indices().rev() {
        used += char_len(c);
        if used > budget {
            break;
        }
        start = i;
    }
    let tail = &text[start..];
    match tail.find('\n') {
        Some(nl) if nl < tail.len() / 2 => &tail[nl + 1..],
        _ => tail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(cut: usize) -> String {
        format!("[{cut} characters cut]")
    }

    #[test]
    fn text_within_the_budget_is_kept_whole() {
        assert_eq!(head_and_tail("a\nb\n", 100, note), "a\nb\n");
    }

    #[test]
    fn a_cut_keeps_head_and_tail_and_counts_what_went_within_the_serialised_budget() {
        // Control characters take six bytes of JSON each: the budget is of those bytes.
        let text = format!("first line\n{}\nlast line\n", "\u{1}".repeat(100_000));
        let out = head_and_tail(&text, 4096, note);
        assert!(json_len(out.as_str()) <= 4096, "{}", json_len(out.as_str()));
        assert!(out.starts_with("first line\n"), "{out:?}");
        assert!(out.ends_with("last line\n"), "{out:?}");
        let cut: usize = out
            .split('[')
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        let kept = out.chars().count() - note(cut).chars().count() - 2;
        assert_eq!(kept + cut, text.chars().count());
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let text = "é".repeat(10_000);
        let out = head_and_tail(&text, 1001, note);
        assert!(json_len(out.as_str()) <= 1001);
        assert!(out.starts_with('é') && out.ends_with('é'));
    }
}
