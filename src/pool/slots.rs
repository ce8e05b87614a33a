//! Execution slots and the bounded FIFO queue in front of them: `size` jobs run at once,
//! session runs hold at most their share, the rest wait until a deadline or are refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::PoolError;

pub(super) struct Slots {
    /// One permit per concurrent execution: `size` jobs run at once, the rest queue.
    pub(super) all: Arc<Semaphore>,
    /// The share of `all` session runs may hold at once: `max(1, size − 1)`.
    pub(super) session_share: Arc<Semaphore>,
    /// Requests waiting, for a slot or for an idle worker.
    pub(super) waiting: AtomicUsize,
    /// Requests holding a slot.
    pub(super) busy: AtomicUsize,
    pub(super) queue_length: usize,
    pub(super) queue_timeout: Duration,
    shutdown: CancellationToken,
}

impl Slots {
    pub(super) fn new(
        size: usize,
        queue_length: usize,
        queue_timeout: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            all: Arc::new(Semaphore::new(size)),
            session_share: Arc::new(Semaphore::new(size.saturating_sub(1).max(1))),
            waiting: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            queue_length,
            queue_timeout,
            shutdown,
        }
    }

    /// The deadline of a checkout starting now.
    pub(super) fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.queue_timeout
    }

    /// A permit of `sem`, at once or after waiting in the bounded queue until `deadline`.
    pub(super) async fn acquire(
        &self,
        sem: &Arc<Semaphore>,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedSemaphorePermit, PoolError> {
        if self.shutdown.is_cancelled() {
            return Err(PoolError::ShuttingDown);
        }
        match sem.clone().try_acquire_owned() {
            Ok(slot) => Ok(slot),
            Err(_) => {
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue_length {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(PoolError::QueueFull);
                }
                let _waiting = WaitingGuard(&self.waiting);
                self.wait(sem.clone().acquire_owned(), deadline).await
            }
        }
    }

    /// Awaits `fut` (a semaphore acquire) until `deadline`, or until shutdown.
    pub(super) async fn wait<P, E>(
        &self,
        fut: impl std::future::Future<Output = Result<P, E>>,
        deadline: tokio::time::Instant,
    ) -> Result<P, PoolError> {
        tokio::select! {
            got = tokio::time::timeout_at(deadline, fut) => match got {
                Ok(Ok(permit)) => Ok(permit),
                Ok(Err(_closed)) => Err(PoolError::ShuttingDown),
                Err(_elapsed) => Err(PoolError::QueueTimeout(self.queue_timeout)),
            },
            () = self.shutdown.cancelled() => Err(PoolError::ShuttingDown),
        }
    }

    /// Counts one more request waiting until the guard is dropped.
    pub(super) fn waiting(&self) -> WaitingGuard<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        WaitingGuard(&self.waiting)
    }

    pub(super) fn close(&self) {
        self.all.close();
        self.session_share.close();
    }
}

pub(super) struct WaitingGuard<'a>(&'a AtomicUsize);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
