//! A run's output on its way to a streaming client: [`OutputSender`] never waits for the
//! client, [`OutputReceiver`] hands the chunks out in the order they came, whenever the
//! client reads.
//!
//! A run must not wait for its reader: while it waited on a full channel its deadline, a
//! cancel and its worker's exit went unwatched, so a client that kept its socket open
//! without reading held the run (its worker, its slot, a session's lock) for as long as it
//! liked. The feed takes every chunk at once instead. Its memory is bounded by what it is
//! given: [`super::capture::Capture`] passes on at most `limits.max_output_bytes` of each
//! stream (and the truncation mark), so a reader that never reads holds at most that much
//! output per stream, plus one order entry (8 bytes) per switch between stdout and stderr.
//! Bytes of the same stream that follow each other share one entry; a reader gone drops
//! what was kept for it and nothing more is kept.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::run::{OutputChunk, Stream};

/// The most a chunk handed to the reader carries, as much as one read of a worker's pipe
/// gives: a reader that comes back late gets its backlog in events of a usual size.
pub const MAX_CHUNK: usize = 64 << 10;

/// A new feed: its sending end (cloned for each attempt of a run) and its receiving end.
pub fn output_feed() -> (OutputSender, OutputReceiver) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            senders: 1,
            ..Queue::default()
        }),
        ready: Notify::new(),
    });
    (OutputSender(Arc::clone(&shared)), OutputReceiver(shared))
}

struct Shared {
    queue: Mutex<Queue>,
    /// Woken on each chunk and when the last sender is dropped.
    ready: Notify,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().expect("output feed lock")
    }
}

#[derive(Default)]
struct Queue {
    stdout: VecDeque<u8>,
    stderr: VecDeque<u8>,
    /// Which stream the next bytes come from, and how many, in the order they came.
    order: VecDeque<(Stream, u32)>,
    senders: usize,
    reader_gone: bool,
}

impl Queue {
    fn bytes(&mut self, stream: Stream) -> &mut VecDeque<u8> {
        match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        }
    }

    fn push(&mut self, stream: Stream, data: &[u8]) {
        // u32 lengths keep an entry at 8 bytes; a longer run of one stream takes more.
        for piece in data.chunks(u32::MAX as usize) {
            let len = piece.len() as u32;
            match self.order.back_mut() {
                Some((last, n)) if *last == stream && n.checked_add(len).is_some() => *n += len,
                _ => self.order.push_back((stream, len)),
            }
            self.bytes(stream).extend(piece);
        }
    }

    fn pop(&mut self) -> Option<OutputChunk> {
        let (stream, n) = self.order.front_mut()?;
        let stream = *stream;
        let take = (*n as usize).min(MAX_CHUNK);
        *n -= take as u32;
        if *n == 0 {
            self.order.pop_front();
        }
        let data = self.bytes(stream).drain(..take).collect();
        Some(OutputChunk { stream, data })
    }
}

/// The run's end of a feed. The feed ends when the last of its clones is dropped.
pub struct OutputSender(Arc<Shared>);

impl OutputSender {
    /// Queues `data` of `stream` for the reader, without waiting; nothing, once the reader
    /// is gone.
    pub fn send(&self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut queue = self.0.queue();
        if queue.reader_gone {
            return;
        }
        queue.push(stream, data);
        drop(queue);
        self.0.ready.notify_one();
    }
}

impl Clone for OutputSender {
    fn clone(&self) -> Self {
        self.0.queue().senders += 1;
        Self(Arc::clone(&self.0))
    }
}

impl Drop for OutputSender {
    fn drop(&mut self) {
        let mut queue = self.0.queue();
        queue.senders -= 1;
        let ended = queue.senders == 0;
        drop(queue);
        if ended {
            self.0.ready.notify_one();
        }
    }
}

/// The client's end of a feed.
pub struct OutputReceiver(Arc<Shared>);

impl OutputReceiver {
    /// The next chunk (at most [`MAX_CHUNK`] bytes of one stream), or `None` once every
    /// chunk was taken and the run has dropped its senders. Cancel-safe: nothing is taken
    /// until it is returned.
    pub async fn recv(&mut self) -> Option<OutputChunk> {
        loop {
            {
                let mut queue = self.0.queue();
                if let Some(chunk) = queue.pop() {
                    return Some(chunk);
                }
                if queue.senders == 0 {
                    return None;
                }
            }
            // A chunk queued since the look above left a permit: this returns at once.
            self.0.ready.notified().await;
        }
    }
}

impl Drop for OutputReceiver {
    fn drop(&mut self) {
        let mut queue = self.0.queue();
        queue.reader_gone = true;
        queue.stdout = VecDeque::new();
        queue.stderr = VecDeque::new();
        queue.order = VecDeque::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(chunk: Option<OutputChunk>) -> Option<(Stream, String)> {
        chunk.map(|c| (c.stream, String::from_utf8(c.data).unwrap()))
    }

    #[tokio::test]
    async fn a_sender_never_waits_and_the_reader_gets_everything_in_order() {
        let (tx, mut rx) = output_feed();
        // Far more sends than any channel buffer held: none of them waits for the reader.
        for i in 0..10_000 {
            let stream = if i % 3 == 2 {
                Stream::Stderr
            } else {
                Stream::Stdout
            };
            tx.send(stream, format!("{i},").as_bytes());
        }
        drop(tx);
        let mut expected: Vec<(Stream, String)> = Vec::new();
        for i in 0..10_000 {
            let stream = if i % 3 == 2 {
                Stream::Stderr
            } else {
                Stream::Stdout
            };
            match expected.last_mut() {
                Some((s, t)) if *s == stream => t.push_str(&format!("{i},")),
                _ => expected.push((stream, format!("{i},"))),
            }
        }
        let mut got = Vec::new();
        while let Some(chunk) = text(rx.recv().await) {
            got.push(chunk);
        }
        assert_eq!(got, expected, "same-stream neighbours share a chunk");
    }

    #[tokio::test]
    async fn a_long_backlog_comes_out_in_chunks_of_a_usual_size() {
        let (tx, mut rx) = output_feed();
        tx.send(Stream::Stdout, &vec![b'x'; MAX_CHUNK * 2 + 5]);
        drop(tx);
        let sizes: Vec<usize> =
            std::iter::from_fn(|| futures_util::FutureExt::now_or_never(rx.recv()).flatten())
                .map(|c| c.data.len())
                .collect();
        assert_eq!(sizes, [MAX_CHUNK, MAX_CHUNK, 5]);
    }

    #[tokio::test]
    async fn the_feed_ends_when_its_last_sender_is_dropped() {
        let (tx, mut rx) = output_feed();
        let retry = tx.clone();
        drop(tx);
        retry.send(Stream::Stderr, b"late");
        let waiting = tokio::spawn(async move {
            let first = text(rx.recv().await);
            (first, text(rx.recv().await))
        });
        tokio::task::yield_now().await;
        drop(retry);
        let (first, second) = waiting.await.unwrap();
        assert_eq!(first, Some((Stream::Stderr, "late".to_owned())));
        assert_eq!(second, None);
    }

    #[tokio::test]
    async fn a_reader_woken_by_a_later_send_gets_it() {
        let (tx, mut rx) = output_feed();
        let reading = tokio::spawn(async move { text(rx.recv().await) });
        tokio::task::yield_now().await;
        tx.send(Stream::Stdout, b"now");
        assert_eq!(
            reading.await.unwrap(),
            Some((Stream::Stdout, "now".to_owned()))
        );
    }

    #[test]
    fn a_gone_reader_leaves_nothing_kept() {
        let (tx, rx) = output_feed();
        tx.send(Stream::Stdout, b"kept for the reader");
        drop(rx);
        tx.send(Stream::Stdout, b"for no one");
        let queue = tx.0.queue();
        assert!(queue.stdout.is_empty() && queue.order.is_empty());
    }
}
