//! The executions a tenant has in progress, counted by its name, and the slot one of them
//! holds until it ends.
//!
//! The count belongs to the name, not to one reading of the keys: a reload that changes
//! a key's entry (its limits, scopes, even its secret) hands the new entry the same
//! counter, so runs started before the reload still count against the new limit. Every
//! run is counted, with or without a `max_concurrent`, so a limit given by a later reload
//! sees the runs already going. A limit lowered below what runs stops nothing: new runs
//! are refused until fewer than the new limit run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many executions one tenant has in progress; shared by every reading of its key.
#[derive(Debug, Default)]
pub struct Running(AtomicUsize);

impl Running {
    /// How many run now.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// One more execution, unless `limit` or more already run: then `Err` with how many do.
    pub fn start(self: &Arc<Self>, limit: Option<usize>) -> Result<ExecutionSlot, usize> {
        let mut now = self.count();
        loop {
            if limit.is_some_and(|limit| now >= limit) {
                return Err(now);
            }
            match self
                .0
                .compare_exchange_weak(now, now + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(ExecutionSlot(self.clone())),
                Err(actual) => now = actual,
            }
        }
    }
}

/// One execution of a tenant, counted until dropped (when the run ends).
#[derive(Debug)]
pub struct ExecutionSlot(Arc<Running>);

impl Drop for ExecutionSlot {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_count_until_dropped_and_a_lowered_limit_refuses_until_under_it() {
        let running = Arc::new(Running::default());
        let a = running.start(Some(2)).unwrap();
        let b = running.start(Some(2)).unwrap();
        assert_eq!(running.start(Some(2)).unwrap_err(), 2);
        // Without a limit every run is still counted.
        let c = running.start(None).unwrap();
        assert_eq!(running.count(), 3);
        // Lowered to 1 with 3 running: nothing is stopped, new runs wait for two to end.
        assert_eq!(running.start(Some(1)).unwrap_err(), 3);
        drop(a);
        assert_eq!(running.start(Some(1)).unwrap_err(), 2);
        drop(c);
        assert_eq!(running.start(Some(1)).unwrap_err(), 1);
        drop(b);
        assert_eq!(running.count(), 0);
        let _d = running.start(Some(1)).unwrap();
        assert_eq!(running.count(), 1);
    }
}
