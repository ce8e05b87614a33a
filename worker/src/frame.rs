//! The frame codec: a u32 little-endian length, then that many bytes of JSON.
//!
//! Every byte a worker sends is hostile, so the length is checked against a maximum
//! before anything is allocated, and a short read is an error, never a partial message.
//! No I/O policy lives here: [`encode`] makes bytes, [`FrameDecoder`] consumes bytes as
//! they arrive (for async readers), and [`read_frame`] / [`write_frame`] wrap blocking
//! `Read` / `Write` for the worker side.

use std::io::{self, Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Bytes in the length prefix.
pub const HEADER_LEN: usize = 4;

/// Largest frame either side accepts: a job carries code and stdin, a result carries rich
/// outputs; 64 MiB bounds both with room to spare.
pub const MAX_FRAME_LEN: usize = 64 << 20;

/// How deep a frame may nest arrays and objects (the frame's own object is level 1): the
/// limit serde_json keeps while it parses, so a deeper frame is [`FrameError::Malformed`]
/// without a level more of recursion. Named here so the protocol is held to it: the
/// deepest frame an honest side sends is a tool call (its object, its arguments object,
/// then an argument up to [`MAX_TOOL_JSON_DEPTH`]) or its answer, well inside it.
///
/// [`MAX_TOOL_JSON_DEPTH`]: crate::jsondepth::MAX_TOOL_JSON_DEPTH
pub const MAX_FRAME_DEPTH: usize = 127;

const _: () = assert!(crate::jsondepth::MAX_TOOL_JSON_DEPTH + 2 <= MAX_FRAME_DEPTH);

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    Oversized { len: usize, max: usize },
    /// The sender had no memory left for the frame's buffer.
    #[error("no memory for a frame of {len} bytes")]
    OutOfMemory { len: usize },
    #[error("stream ended inside a frame ({got} of {expected} bytes)")]
    Truncated { got: usize, expected: usize },
    #[error("record of {got} bytes does not match its length prefix of {expected}")]
    LengthMismatch { got: usize, expected: usize },
    #[error("frame is not a valid message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("i/o error on the frame stream: {0}")]
    Io(#[from] io::Error),
}

/// Serialises `msg` into one frame (prefix included).
///
/// The body is measured first (serialised into a counter, which allocates nothing), then
/// written into one buffer of exactly its size, asked for fallibly: an oversized frame is
/// refused before anything is allocated, and a frame there is no memory for (a worker's
/// result of many rich outputs at the end of a job that used up its memory limit) is
/// [`FrameError::OutOfMemory`], which its sender can report, where a buffer grown by
/// doubling aborted the process on the first allocation that failed.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, msg)?;
    let len = counter.0;
    if len > MAX_FRAME_LEN {
        return Err(FrameError::Oversized {
            len,
            max: MAX_FRAME_LEN,
        });
    }
    let mut buf = Vec::new();
    buf.try_reserve_exact(HEADER_LEN + len)
        .map_err(|_| FrameError::OutOfMemory { len })?;
    buf.extend_from_slice(&[0; HEADER_LEN]);
    serde_json::to_writer(&mut buf, msg)?;
    debug_assert_eq!(buf.len(), HEADER_LEN + len, "serialised twice, the same");
    buf[..HEADER_LEN].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(buf)
}

/// A writer that only counts the bytes written to it.
struct Counter(usize);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decodes one complete frame (prefix included) such as a SOCK_SEQPACKET record.
pub fn decode_exact<T: DeserializeOwned>(frame: &[u8], max: usize) -> Result<T, FrameError> {
    if frame.len() < HEADER_LEN {
        return Err(FrameError::Truncated {
            got: frame.len(),
            expected: HEADER_LEN,
        });
    }
    let len = body_len(frame, max)?;
    let body = &frame[HEADER_LEN..];
    if body.len() != len {
        return Err(FrameError::LengthMismatch {
            got: body.len(),
            expected: len,
        });
    }
    Ok(serde_json::from_slice(body)?)
}

fn body_len(header: &[u8], max: usize) -> Result<usize, FrameError> {
    let mut prefix = [0u8; HEADER_LEN];
    prefix.copy_from_slice(&header[..HEADER_LEN]);
    let len = u32::from_le_bytes(prefix) as usize;
    if len > max {
        return Err(FrameError::Oversized { len, max });
    }
    Ok(len)
}

/// Writes one frame and flushes.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame. `Ok(None)` means the stream ended cleanly between frames.
pub fn read_frame<R: Read, T: DeserializeOwned>(
    r: &mut R,
    max: usize,
) -> Result<Option<T>, FrameError> {
    match read_body(r, max)? {
        Some(body) => Ok(Some(serde_json::from_slice(&body)?)),
        None => Ok(None),
    }
}

/// Reads one frame's body, not decoded (for a reader that decodes some frames its own
/// way). `Ok(None)` means the stream ended cleanly between frames.
pub fn read_body<R: Read>(r: &mut R, max: usize) -> Result<Option<Vec<u8>>, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    let got = read_full(r, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got < HEADER_LEN {
        return Err(FrameError::Truncated {
            got,
            expected: HEADER_LEN,
        });
    }
    let len = body_len(&header, max)?;
    let mut body = vec![0u8; len];
    let got = read_full(r, &mut body)?;
    if got < len {
        return Err(FrameError::Truncated { got, expected: len });
    }
    Ok(Some(body))
}

/// Reads until `buf` is full or the stream ends; returns how many bytes were read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Incremental decoder for readers that hand over bytes as they come (async sockets).
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max: usize,
}

impl FrameDecoder {
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            max,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Returns the next complete frame, `Ok(None)` if more bytes are needed. An oversized
    /// length is reported as soon as its prefix is in, before the body is buffered.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = body_len(&self.buf, self.max)?;
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let msg = serde_json::from_slice(&self.buf[HEADER_LEN..HEADER_LEN + len]);
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(msg?))
    }

    /// Call at end of stream: leftover bytes mean the peer stopped inside a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buf.len() {
            0 => Ok(()),
            got if got < HEADER_LEN => Err(FrameError::Truncated {
                got,
                expected: HEADER_LEN,
            }),
            got => {
                let expected = body_len(&self.buf, usize::MAX)?;
                Err(FrameError::Truncated {
                    got: got - HEADER_LEN,
                    expected,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        text: String,
        n: u32,
    }

    fn sample() -> Msg {
        Msg {
            text: "héllo\n\0 world".into(),
            n: 7,
        }
    }

    /// A reader that hands out one byte per call, like a slow socket.
    struct OneByte<'a>(&'a [u8]);

    impl Read for OneByte<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.split_first() {
                Some((b, rest)) if !buf.is_empty() => {
                    buf[0] = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn round_trip_through_write_and_read() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &sample()).unwrap();
        write_frame(
            &mut wire,
            &Msg {
                text: String::new(),
                n: 0,
            },
        )
        .unwrap();
        let mut r = &wire[..];
        assert_eq!(
            read_frame::<_, Msg>(&mut r, MAX_FRAME_LEN).unwrap(),
            Some(sample())
        );
        assert_eq!(
            read_frame::<_, Msg>(&mut r, MAX_FRAME_LEN)
                .unwrap()
                .unwrap()
                .n,
            0
        );
        assert!(
            read_frame::<_, Msg>(&mut r, MAX_FRAME_LEN)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn one_byte_reader_gets_the_whole_frame() {
        let wire = encode(&sample()).unwrap();
        let got: Option<Msg> = read_frame(&mut OneByte(&wire), MAX_FRAME_LEN).unwrap();
        assert_eq!(got, Some(sample()));
    }

    #[test]
    fn decoder_fed_one_byte_at_a_time_yields_each_frame_once() {
        let mut wire = encode(&sample()).unwrap();
        wire.extend(
            encode(&Msg {
                text: "b".into(),
                n: 2,
            })
            .unwrap(),
        );
        let mut dec = FrameDecoder::new(MAX_FRAME_LEN);
        let mut got = Vec::new();
        for b in &wire {
            dec.push(std::slice::from_ref(b));
            while let Some(m) = dec.next_frame::<Msg>().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(
            got,
            vec![
                sample(),
                Msg {
                    text: "b".into(),
                    n: 2
                }
            ]
        );
        dec.finish().unwrap();
    }

    /// A frame of rich outputs is one buffer of exactly its size (no doubling, which needs
    /// twice the room for a moment, and aborts the worker where that room is not there),
    /// and one over the maximum is refused without being built.
    #[test]
    fn a_frame_is_one_buffer_of_its_exact_size_and_an_oversized_one_is_refused() {
        let msg = Msg {
            text: "iVBORw0KGgo".repeat(100_000),
            n: 7,
        };
        let wire = encode(&msg).unwrap();
        assert_eq!(wire.capacity(), wire.len());
        assert_eq!(decode_exact::<Msg>(&wire, MAX_FRAME_LEN).unwrap(), msg);

        let msg = Msg {
            text: "x".repeat(MAX_FRAME_LEN),
            n: 0,
        };
        let err = encode(&msg).unwrap_err();
        assert!(
            matches!(err, FrameError::Oversized { len, max: MAX_FRAME_LEN } if len > MAX_FRAME_LEN),
            "{err}"
        );
    }

    #[test]
    fn oversized_length_is_rejected_before_the_body_arrives() {
        let header = (1_000_000u32).to_le_bytes();
        let err = read_frame::<_, Msg>(&mut &header[..], 1024).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Oversized {
                    len: 1_000_000,
                    max: 1024
                }
            ),
            "{err}"
        );

        let mut dec = FrameDecoder::new(1024);
        dec.push(&header);
        let err = dec.next_frame::<Msg>().unwrap_err();
        assert!(
            matches!(err, FrameError::Oversized { len: 1_000_000, .. }),
            "{err}"
        );
    }

    #[test]
    fn truncated_header_and_body_are_errors() {
        let wire = encode(&sample()).unwrap();
        let err = read_frame::<_, Msg>(&mut &wire[..2], MAX_FRAME_LEN).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Truncated {
                    got: 2,
                    expected: 4
                }
            ),
            "{err}"
        );
        let cut = wire.len() - 3;
        let err = read_frame::<_, Msg>(&mut &wire[..cut], MAX_FRAME_LEN).unwrap_err();
        assert!(matches!(err, FrameError::Truncated { .. }), "{err}");

        let mut dec = FrameDecoder::new(MAX_FRAME_LEN);
        dec.push(&wire[..cut]);
        assert!(dec.next_frame::<Msg>().unwrap().is_none());
        assert!(matches!(dec.finish(), Err(FrameError::Truncated { .. })));
        assert!(matches!(
            decode_exact::<Msg>(&wire[..cut], MAX_FRAME_LEN),
            Err(FrameError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn garbage_body_is_malformed_not_a_panic() {
        let mut wire = 5u32.to_le_bytes().to_vec();
        wire.extend_from_slice(b"\xff{]x!");
        let err = read_frame::<_, Msg>(&mut &wire[..], MAX_FRAME_LEN).unwrap_err();
        assert!(matches!(err, FrameError::Malformed(_)), "{err}");
        let err = decode_exact::<Msg>(&wire, MAX_FRAME_LEN).unwrap_err();
        assert!(matches!(err, FrameError::Malformed(_)), "{err}");
    }

    /// A frame `levels` deep: a tool call whose argument nests the rest.
    fn deep_call(levels: usize) -> Vec<u8> {
        let argument = "[".repeat(levels - 2) + &"]".repeat(levels - 2);
        let body =
            format!(r#"{{"type":"tool_call","id":1,"name":"t","arguments":{{"x":{argument}}}}}"#);
        let mut wire = (body.len() as u32).to_le_bytes().to_vec();
        wire.extend_from_slice(body.as_bytes());
        wire
    }

    /// Frames up to the depth limit decode, at either end; deeper ones are malformed, and a
    /// hostile frame a million levels deep is refused as quickly, without using the stack.
    #[test]
    fn frames_decode_up_to_their_depth_limit_and_no_deeper() {
        use crate::protocol::WorkerMessage;
        let deepest = deep_call(MAX_FRAME_DEPTH);
        let mut dec = FrameDecoder::new(MAX_FRAME_LEN);
        dec.push(&deepest);
        assert!(matches!(
            dec.next_frame::<WorkerMessage>(),
            Ok(Some(WorkerMessage::ToolCall(_)))
        ));
        for levels in [MAX_FRAME_DEPTH + 1, 1_000_000] {
            let wire = deep_call(levels);
            let mut dec = FrameDecoder::new(MAX_FRAME_LEN);
            dec.push(&wire);
            let err = dec.next_frame::<WorkerMessage>().unwrap_err();
            assert!(matches!(err, FrameError::Malformed(_)), "{err}");
            assert!(err.to_string().contains("recursion limit"), "{err}");
            // Nothing is left of it in the decoder.
            dec.finish().unwrap();
            let err = read_frame::<_, WorkerMessage>(&mut &wire[..], MAX_FRAME_LEN).unwrap_err();
            assert!(matches!(err, FrameError::Malformed(_)), "{err}");
        }
    }

    #[test]
    fn decode_exact_accepts_one_whole_record() {
        let wire = encode(&sample()).unwrap();
        assert_eq!(decode_exact::<Msg>(&wire, MAX_FRAME_LEN).unwrap(), sample());
        let mut long = wire.clone();
        long.push(b' ');
        assert!(matches!(
            decode_exact::<Msg>(&long, MAX_FRAME_LEN),
            Err(FrameError::LengthMismatch { .. })
        ));
    }
}
