//! Taking an idle worker for a job or a session: of the tier it was routed to, else of a
//! fuller one, waiting for the refill when none has one; of a tier that serves when the
//! one it was routed to is still starting (`Generation::serving_tier`). A wait that outlives its
//! generation (a rollover switched meanwhile) moves on to the current one, so a request
//! in flight during a rollover is served, never failed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::events::KillReason;
use super::generation::Generation;
use super::idle::{IdleSet, Taken};
use super::worker::Worker;
use super::{Inner, PoolError};

/// Idle workers whose workspace vanished that one take skips before it gives up.
const MAX_UNUSABLE_IDLE: usize = 64;

impl Inner {
    /// An idle worker for a job routed to tier `routed` of `generation`: of that tier (of
    /// one that serves while it starts), else of a fuller one, waiting (until `deadline`)
    /// for the refill when none has one. Counts the demand for `routed`.
    pub(super) async fn take_idle(
        self: &Arc<Self>,
        mut generation: Arc<Generation>,
        mut routed: usize,
        deadline: tokio::time::Instant,
    ) -> Result<Worker, PoolError> {
        if let Some(targets) = generation.table.record(routed) {
            for (tier, target) in generation.tiers.iter().zip(targets) {
                tier.target.store(target, Ordering::Release);
            }
            self.refill.notify_one();
        }
        let mut unusable = 0;
        loop {
            if generation.retired.is_cancelled() && !self.shutdown.is_cancelled() {
                // Switched while this request waited: any code runs on any tier, so the
                // new generation's fullest serves it.
                generation = self.generations.current();
                routed = generation.tiers.len() - 1;
            }
            let serving = generation.serving_tier(routed);
            let candidates = generation.table.candidates(serving).to_vec();
            let sets: Vec<&IdleSet> = candidates
                .iter()
                .map(|&i| &generation.tiers[i].idle)
                .collect();
            let (index, taken) = match sets
                .iter()
                .enumerate()
                .find_map(|(i, set)| set.try_take().map(|taken| (i, taken)))
            {
                Some(found) => found,
                None => {
                    let _waiting = self.slots.waiting();
                    // A tier whose target is 0 still gets a worker for a job that waits.
                    let _wanted = generation.tiers[serving].want();
                    generation.tiers[serving].skip_a_warm_up();
                    self.refill.notify_one();
                    let take = self.slots.wait(IdleSet::take_any(&sets), deadline);
                    tokio::pin!(take);
                    // Waiting for a worker that cannot be started would only end in a
                    // timeout: answer at once that the service is degraded.
                    let got = loop {
                        if let Some(why) = self.counters.spawn_trouble() {
                            return Err(PoolError::NoWorkers(why));
                        }
                        tokio::select! {
                            biased;
                            () = generation.retired.cancelled(), if !self.shutdown.is_cancelled() => break None,
                            got = &mut take => break Some(got?),
                            () = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    };
                    match got {
                        Some(found) => found,
                        None => continue,
                    }
                }
            };
            // Its replacement is asked for now, by this task, which is awake anyway (waking
            // the refill task for it would cost a wake-up per request, often on the other
            // thread); the zygote makes it once this job has had the CPU.
            super::refill::stock(self, &generation);
            let Taken::Worker(mut worker) = taken else {
                continue;
            };
            let tier = &generation.tiers[candidates[index]];
            let restarts = tier.zygote().map(|z| z.restarts);
            if restarts != Some(worker.zygote_restarts) || !worker.is_alive() {
                // Died with its zygote while idle: skip it, the refill replaces it.
                self.events.worker_killed(KillReason::LostIdle);
                continue;
            }
            if !worker.workspace_path().is_dir() {
                // Its workspace was removed while it was idle (the workspace root was
                // deleted): it could not run a job. No code ran on it, so skipping costs
                // nothing, and every idle worker may be one: skip until they run out and
                // a fresh spawn serves (or says why none can be made), bounded in case
                // workspaces keep vanishing.
                self.counters.workers_lost.fetch_add(1, Ordering::Relaxed);
                self.events.worker_killed(KillReason::LostIdle);
                unusable += 1;
                if unusable >= MAX_UNUSABLE_IDLE {
                    return Err(PoolError::Unavailable(
                        "the worker's workspace was removed".into(),
                    ));
                }
                continue;
            }
            tier.checkouts.fetch_add(1, Ordering::Relaxed);
            self.events
                .checked_out(&tier.name, &generation.tiers[routed].name);
            return Ok(worker);
        }
    }
}
