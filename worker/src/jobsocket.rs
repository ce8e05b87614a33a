//! The worker's job socket (fd 3), shared by the job loop and every thread of user code
//! that calls a host tool.
//!
//! Writes: every frame goes out whole under one write lock ([`JobSocket::writer`]): tool
//! calls from any thread, the job loop's `Ready`, `Result` and session replies. The lock
//! is held only for the write itself (and, by the tools, for the check that the job still
//! offers them, see `tools.rs`), never while waiting for anything else.
//!
//! Reads are demultiplexed, leader/follower: one thread at a time reads a frame from the
//! socket, with no lock held; it files what it read and wakes the others:
//!
//! - a `ToolResult` goes to the call waiting for its id, as its text ([`Answer`], never
//!   parsed here: the reader may be a thread of user code with a small stack); an answer
//!   for an id nobody waits for any more (its job ended, the call was answered locally) is
//!   discarded;
//! - any other request is kept, in order, for the job loop ([`JobSocket::next_request`]);
//! - the end of the stream, or a frame that is no request, ends every wait.
//!
//! Then, if its own wait is not over, it (or another waiter) reads again. So a thread left
//! from an earlier job of a session, blocked reading while the next request arrives, hands
//! that request to the job loop, and the job loop, reading between jobs, hands a late
//! answer to nobody.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::{Condvar, Mutex, MutexGuard};

use snakecage_worker::frame::{self, FrameError, MAX_FRAME_LEN};
use snakecage_worker::protocol::{JobRequest, ToolOutcome, WorkerMessage};

use crate::sandbox::fds;

mod answer;

pub use self::answer::Answer;
use self::answer::Frame;

/// The process's job socket.
pub static JOB: JobSocket = JobSocket::new(fds::JOB_FD);

pub struct JobSocket {
    fd: RawFd,
    write: Mutex<()>,
    shared: Mutex<Shared>,
    /// Signalled whenever a frame has been filed, a call answered locally, the stream
    /// ended, or the reader stepped down.
    wake: Condvar,
}

struct Shared {
    /// A thread is reading a frame (the leader); the others wait.
    reading: bool,
    /// Calls waiting for their answer, by id: `None` until it comes.
    calls: BTreeMap<u64, Option<Answer>>,
    /// Requests for the job loop, read by whichever thread was reading.
    requests: VecDeque<JobRequest>,
    /// The stream ended (`None` inside: cleanly, between frames) or broke.
    end: Option<Option<String>>,
}

/// Why a wait on the socket ended without what it waited for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ended {
    #[error("the supervisor hung up")]
    HungUp,
    #[error("{0}")]
    Broken(String),
}

/// The write lock, held: frames written through it go out whole, in order.
pub struct Writer<'a> {
    fd: RawFd,
    _held: MutexGuard<'a, ()>,
}

impl Writer<'_> {
    pub fn send(&mut self, msg: &WorkerMessage) -> Result<(), FrameError> {
        self.send_encoded(&frame::encode(msg)?)
    }

    /// Writes a frame made with [`frame::encode`].
    pub fn send_encoded(&mut self, bytes: &[u8]) -> Result<(), FrameError> {
        // SAFETY: `fd` is the job socket, open for the life of the process; ManuallyDrop
        // keeps this File from closing it.
        let mut sock = ManuallyDrop::new(unsafe { File::from_raw_fd(self.fd) });
        sock.write_all(bytes)?;
        sock.flush()?;
        Ok(())
    }
}

/// A lock whose holder panicked leaves nothing half-written in these structures.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl JobSocket {
    pub const fn new(fd: RawFd) -> Self {
        Self {
            fd,
            write: Mutex::new(()),
            shared: Mutex::new(Shared {
                reading: false,
                calls: BTreeMap::new(),
                requests: VecDeque::new(),
                end: None,
            }),
            wake: Condvar::new(),
        }
    }

    /// Takes the write lock (waiting while another frame goes out).
    pub fn writer(&self) -> Writer<'_> {
        Writer {
            fd: self.fd,
            _held: lock(&self.write),
        }
    }

    /// Writes one frame under the write lock.
    pub fn send(&self, msg: &WorkerMessage) -> Result<(), FrameError> {
        self.writer().send(msg)
    }

    /// Registers call `id` as waiting for its answer; done under the write lock, before
    /// its frame goes out, so the answer cannot arrive unregistered.
    pub fn expect(&self, _writer: &Writer<'_>, id: u64) {
        lock(&self.shared).calls.insert(id, None);
    }

    /// Whether call `id` still waits for its answer (none has come, nor a local one).
    pub fn awaits(&self, id: u64) -> bool {
        matches!(lock(&self.shared).calls.get(&id), Some(None))
    }

    /// Forgets call `id` (its frame could not be sent).
    pub fn forget(&self, id: u64) {
        lock(&self.shared).calls.remove(&id);
    }

    /// Answers every call still waiting with `outcome` (the job ended), and wakes them. A
    /// late answer from the supervisor then finds nobody and is discarded.
    pub fn answer_all_locally(&self, outcome: &ToolOutcome) {
        let outcome = Answer::local(outcome);
        let mut shared = lock(&self.shared);
        let mut answered = false;
        for answer in shared.calls.values_mut().filter(|a| a.is_none()) {
            *answer = Some(outcome.clone());
            answered = true;
        }
        if answered {
            self.wake.notify_all();
        }
    }

    /// Calls waiting for an answer that has not come (tests look).
    #[cfg(test)]
    pub(crate) fn waiting_count(&self) -> usize {
        lock(&self.shared)
            .calls
            .values()
            .filter(|a| a.is_none())
            .count()
    }

    /// Waits for the answer to call `id` (registered with [`JobSocket::expect`]), reading
    /// the socket when no other thread is. Blocks without any lock held in between: call
    /// it with the GIL released.
    pub fn wait_answer(&self, id: u64) -> Result<Answer, Ended> {
        self.wait(|shared| match shared.calls.get(&id) {
            Some(Some(_)) => shared.calls.remove(&id).flatten(),
            Some(None) => None,
            // Not registered (cannot happen): nothing will ever answer it.
            None => Some(Answer::local(&ToolOutcome::error(
                snakecage_worker::protocol::ToolErrorKind::Cancelled,
                "the call was not registered",
            ))),
        })
        .inspect_err(|_| {
            lock(&self.shared).calls.remove(&id);
        })
    }

    /// The job loop's next request: one a tool thread already read, or the next frame
    /// that is not a tool answer. `Ok(None)`: the supervisor hung up between frames.
    pub fn next_request(&self) -> Result<Option<JobRequest>, String> {
        match self.wait(|shared| shared.requests.pop_front()) {
            Ok(request) => Ok(Some(request)),
            Err(Ended::HungUp) => Ok(None),
            Err(Ended::Broken(why)) => Err(why),
        }
    }

    /// Waits until `take` finds what this thread waits for, leading the reads while no
    /// other thread does.
    fn wait<T>(&self, mut take: impl FnMut(&mut Shared) -> Option<T>) -> Result<T, Ended> {
        let mut shared = lock(&self.shared);
        loop {
            if let Some(found) = take(&mut shared) {
                return Ok(found);
            }
            match &shared.end {
                Some(None) => return Err(Ended::HungUp),
                Some(Some(why)) => return Err(Ended::Broken(why.clone())),
                None => {}
            }
            if shared.reading {
                shared = self
                    .wake
                    .wait(shared)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            }
            shared.reading = true;
            drop(shared);
            let read = self.read_one();
            shared = lock(&self.shared);
            shared.reading = false;
            match read {
                Ok(Some(Frame::Answer { id, answer })) => {
                    if let Some(slot @ None) = shared.calls.get_mut(&id) {
                        *slot = Some(answer);
                    }
                    // else: nobody waits for it any more (or it was answered locally).
                }
                Ok(Some(Frame::Request(request))) => shared.requests.push_back(request),
                Ok(None) => shared.end = Some(None),
                Err(e) => shared.end = Some(Some(e.to_string())),
            }
            // Whatever was filed, someone else may be waiting for it, or for the reader
            // to step down.
            self.wake.notify_all();
        }
    }

    fn read_one(&self) -> Result<Option<Frame>, FrameError> {
        // SAFETY: `fd` is the job socket, open for the life of the process; ManuallyDrop
        // keeps this File from closing it. Only the leader reads, so no two reads
        // interleave.
        let mut sock = ManuallyDrop::new(unsafe { File::from_raw_fd(self.fd) });
        frame::read_body(&mut *sock, MAX_FRAME_LEN)?
            .map(answer::classify)
            .transpose()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    use snakecage_worker::protocol::{Job, ToolErrorKind, ToolResult};

    /// A job socket over one end of a socket pair, and the supervisor's end. The socket
    /// is leaked: a `JobSocket` names its fd, it does not own it.
    pub(crate) fn pair() -> (&'static JobSocket, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let fd: OwnedFd = ours.into();
        let raw = fd.as_raw_fd();
        std::mem::forget(fd);
        (Box::leak(Box::new(JobSocket::new(raw))), theirs)
    }

    pub(crate) fn answer(sup: &mut UnixStream, id: u64, result: serde_json::Value) {
        let msg = JobRequest::ToolResult(ToolResult {
            id,
            outcome: ToolOutcome::Ok { result },
        });
        frame::write_frame(sup, &msg).unwrap();
    }

    fn ok(answer: Answer) -> serde_json::Value {
        match answer.outcome() {
            ToolOutcome::Ok { result } => result,
            other => panic!("not ok: {other:?}"),
        }
    }

    fn job(code: &str) -> JobRequest {
        JobRequest::Run(Job {
            code: code.into(),
            stdin: None,
            last_line_interactive: false,
            entrypoint: None,
            args: Vec::new(),
            max_bundle_bytes: 0,
            timeout_ms: 0,
            tools: Vec::new(),
            max_concurrent_tool_calls: 1,
        })
    }

    fn wait_until(what: impl Fn() -> bool) {
        while !what() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn answers_reach_their_callers_in_any_order() {
        let (sock, mut sup) = pair();
        let waiters: Vec<_> = (1..=3u64)
            .map(|id| {
                sock.expect(&sock.writer(), id);
                std::thread::spawn(move || sock.wait_answer(id))
            })
            .collect();
        wait_until(|| lock(&sock.shared).reading);
        for id in [3, 1, 2] {
            answer(&mut sup, id, serde_json::json!(format!("für {id}")));
        }
        let got: Vec<_> = waiters
            .into_iter()
            .map(|w| ok(w.join().unwrap().unwrap()))
            .collect();
        assert_eq!(got, ["für 1", "für 2", "für 3"]);
        assert_eq!(sock.waiting_count(), 0);
    }

    #[test]
    fn a_request_read_by_a_tool_thread_is_kept_for_the_job_loop_and_stale_answers_go_nowhere() {
        let (sock, mut sup) = pair();
        sock.expect(&sock.writer(), 7);
        let caller = std::thread::spawn(move || sock.wait_answer(7));
        wait_until(|| lock(&sock.shared).reading);
        // The job ends: its call is answered here, while the thread is still reading.
        sock.answer_all_locally(&ToolOutcome::error(ToolErrorKind::Cancelled, "ended"));
        // The supervisor's late answer to the call goes nowhere (it wakes the reader, whose
        // own wait is over); the next job goes to the job loop.
        answer(&mut sup, 7, serde_json::json!("late"));
        assert!(matches!(
            caller.join().unwrap().map(|a| a.outcome()),
            Ok(ToolOutcome::Error {
                kind: ToolErrorKind::Cancelled,
                ..
            })
        ));
        frame::write_frame(&mut sup, &job("print('zwei')")).unwrap();
        let Some(JobRequest::Run(next)) = sock.next_request().unwrap() else {
            panic!("no job")
        };
        assert_eq!(next.code, "print('zwei')");
        assert_eq!(sock.waiting_count(), 0);
        drop(sup);
        assert!(matches!(sock.next_request(), Ok(None)));
    }

    #[test]
    fn a_thread_left_reading_hands_the_next_request_to_the_job_loop() {
        let (sock, mut sup) = pair();
        sock.expect(&sock.writer(), 1);
        let stale = std::thread::spawn(move || sock.wait_answer(1));
        wait_until(|| lock(&sock.shared).reading);
        sock.answer_all_locally(&ToolOutcome::error(ToolErrorKind::Cancelled, "ended"));
        // The leader is still blocked in its read: the job loop waits as a follower and
        // gets the request the leader reads.
        let loop_ = std::thread::spawn(move || sock.next_request());
        frame::write_frame(&mut sup, &JobRequest::Inspect).unwrap();
        assert!(matches!(
            loop_.join().unwrap(),
            Ok(Some(JobRequest::Inspect))
        ));
        assert!(matches!(
            stale.join().unwrap().map(|a| a.outcome()),
            Ok(ToolOutcome::Error { .. })
        ));
    }

    #[test]
    fn a_broken_stream_ends_every_wait() {
        let (sock, mut sup) = pair();
        sock.expect(&sock.writer(), 1);
        let caller = std::thread::spawn(move || sock.wait_answer(1));
        sup.write_all(&[5, 0, 0, 0, b'{', b']']).unwrap();
        drop(sup);
        let Err(Ended::Broken(why)) = caller.join().unwrap() else {
            panic!("not broken")
        };
        assert!(why.contains("stream ended inside a frame"), "{why}");
        assert!(sock.next_request().unwrap_err().contains("inside a frame"));
    }
}
