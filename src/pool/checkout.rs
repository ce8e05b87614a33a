//! What a caller holds while it uses the pool: a checked-out worker with its slot, a
//! session run's slot, a finished run's workspace; and the guards that count and report
//! them when they are dropped.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::OwnedSemaphorePermit;

use super::events::{KillReason, PoolEvents};
use super::run::RunOutcome;
use super::worker::{Worker, Workspace};
use super::{Inner, PoolError};

/// Fills a fresh worker's workspace before its job is sent (staging input files). Called
/// again, on another worker, when the first one was lost before it took the job.
pub trait Stager: Sync {
    type Staged: Send;
    type Error: From<PoolError> + Send;

    fn stage(
        &self,
        workspace: &Path,
    ) -> impl std::future::Future<Output = Result<Self::Staged, Self::Error>> + Send;
}

/// Stages nothing.
pub struct NoStaging;

impl Stager for NoStaging {
    type Staged = ();
    type Error = PoolError;

    async fn stage(&self, _: &Path) -> Result<(), PoolError> {
        Ok(())
    }
}

/// A finished run: its outcome, what staging returned, and its workspace, which the
/// caller may scan. The worker is dead; the execution slot stays taken and the workspace
/// stays on disk until this is dropped. A run cancelled while it waited in the queue has
/// none of them.
pub struct Finished<S> {
    pub outcome: RunOutcome,
    pub staged: Option<S>,
    pub(super) workspace: Option<Workspace>,
    pub(super) _slot: Option<(OwnedSemaphorePermit, BusyGuard)>,
}

impl<S> Finished<S> {
    /// A run its client cancelled while it waited `waited` for a slot: it never started.
    pub(super) fn cancelled_in_queue(waited: std::time::Duration) -> Self {
        Self {
            outcome: RunOutcome::cancelled_in_queue(waited),
            staged: None,
            workspace: None,
            _slot: None,
        }
    }
}

impl<S> Finished<S> {
    pub fn workspace_path(&self) -> Option<&Path> {
        self.workspace.as_ref().map(|w| w.path.as_path())
    }

    /// Removes the workspace (once it has been scanned) and returns when it is gone, so
    /// that the space the job's files took is free again before its client is answered.
    pub async fn remove_workspace(&mut self) {
        if let Some(workspace) = self.workspace.take() {
            workspace.remove().await;
        }
    }
}

/// A worker checked out for one job, with the execution slot it occupies. Dropping it
/// (after the run, or when the request is abandoned) kills the worker and frees the slot.
pub struct Checkout {
    pub worker: Worker,
    pub(super) _slot: OwnedSemaphorePermit,
    pub(super) _busy: BusyGuard,
}

/// The execution slot of one session run; dropping it frees the slot.
pub struct SessionSlot {
    pub(super) _share: OwnedSemaphorePermit,
    pub(super) _slot: OwnedSemaphorePermit,
    pub(super) _busy: BusyGuard,
}

/// Counts a request holding a slot, until dropped.
pub(super) struct BusyGuard(Arc<Inner>);

impl BusyGuard {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        inner.slots.busy.fetch_add(1, Ordering::Relaxed);
        Self(inner)
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.slots.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Reports an abandoned job when a request is dropped (its client went away) while its
/// worker is staged or running; the dropped checkout kills the worker.
pub(super) struct AbandonGuard<'a>(Option<&'a dyn PoolEvents>);

impl<'a> AbandonGuard<'a> {
    pub(super) fn new(events: &'a dyn PoolEvents) -> Self {
        Self(Some(events))
    }

    pub(super) fn defuse(mut self) {
        self.0 = None;
    }
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if let Some(events) = self.0 {
            events.worker_killed(KillReason::Abandoned);
        }
    }
}
