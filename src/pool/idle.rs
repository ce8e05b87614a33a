//! The idle workers of one tier: forked, hardened, warmed up, waiting for a job. A
//! semaphore counts them so a taker can wait for the refill, on one tier or several.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures_util::future::select_all;
use tokio::sync::{AcquireError, Semaphore};

use super::worker::Worker;

pub(super) struct IdleSet {
    workers: Mutex<VecDeque<Worker>>,
    /// One permit per idle worker (possibly more, after stale workers were purged: a taker
    /// that finds the deque empty simply waits again).
    available: Semaphore,
}

/// What a taker found after claiming a permit. (Moved once per take: boxing the worker
/// would only add an allocation per job.)
#[allow(clippy::large_enum_variant)]
pub(super) enum Taken {
    Worker(Worker),
    /// The permit was stale (its worker was purged with a dead zygote): look again.
    Nothing,
}

impl Default for IdleSet {
    fn default() -> Self {
        Self {
            workers: Mutex::default(),
            available: Semaphore::new(0),
        }
    }
}

impl IdleSet {
    pub(super) fn push(&self, worker: Worker) {
        self.workers.lock().expect("idle lock").push_back(worker);
        self.available.add_permits(1);
    }

    pub(super) fn len(&self) -> usize {
        self.workers.lock().expect("idle lock").len()
    }

    /// Removes every idle worker (their zygote died, or the pool shuts down).
    pub(super) fn drain(&self) -> VecDeque<Worker> {
        std::mem::take(&mut *self.workers.lock().expect("idle lock"))
    }

    pub(super) fn close(&self) {
        self.available.close();
    }

    /// The oldest idle worker, if one is counted as available now.
    pub(super) fn try_take(&self) -> Option<Taken> {
        let permit = self.available.try_acquire().ok()?;
        permit.forget();
        Some(self.pop())
    }

    fn pop(&self) -> Taken {
        match self.workers.lock().expect("idle lock").pop_front() {
            Some(worker) => Taken::Worker(worker),
            None => Taken::Nothing,
        }
    }

    /// Takes the newest idle worker out for good (to be dropped, which kills it), with its
    /// permit, if one can be had at once.
    pub(super) fn retire_newest(&self) -> Option<Worker> {
        let permit = self.available.try_acquire().ok()?;
        permit.forget();
        self.workers.lock().expect("idle lock").pop_back()
    }

    /// Whether an idle worker skipped its warm-up.
    pub(super) fn has_cold(&self) -> bool {
        let workers = self.workers.lock().expect("idle lock");
        workers.iter().any(|w| !w.warmed)
    }

    /// Takes the oldest idle worker that skipped its warm-up out for good (to be dropped,
    /// which kills it), with its permit, if there is one, a warmed one stays, and a permit
    /// can be had at once.
    pub(super) fn retire_a_cold_one(&self) -> Option<Worker> {
        let mut workers = self.workers.lock().expect("idle lock");
        if !workers.iter().any(|w| w.warmed) {
            return None;
        }
        let at = workers.iter().position(|w| !w.warmed)?;
        let permit = self.available.try_acquire().ok()?;
        permit.forget();
        workers.remove(at)
    }

    /// Waits until one of `sets` has a worker available and takes it: the index in `sets`
    /// and what was found. Cancel-safe: a permit is claimed only by the future that wins.
    pub(super) async fn take_any(sets: &[&IdleSet]) -> Result<(usize, Taken), AcquireError> {
        let waits = sets.iter().map(|set| Box::pin(set.available.acquire()));
        let (permit, index, _rest) = select_all(waits).await;
        permit?.forget();
        Ok((index, sets[index].pop()))
    }
}
