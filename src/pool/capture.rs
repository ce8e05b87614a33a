//! Bounded capture of one output stream: keeps the first `max` bytes, counts and drops the
//! rest, so a job that floods its output costs the supervisor nothing but pipe reads.

/// Appended to output that was cut.
pub const TRUNCATION_SUFFIX: &str = "\n...[truncated]";

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

#[cfg(test)]
mod tests {
    use super::*;

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
