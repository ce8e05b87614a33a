//! The supervisor's CPU-time watchdog over session workers, where it may not move their
//! kernel limits ([`super::cpu_budget`]): one task for all of them reads each one's CPU
//! clock every [`PERIOD`] and SIGKILLs, through its pidfd, one that has used more than its
//! budget allows. A request's start and end read it too, so a worker over its budget
//! between requests is killed before its next request runs, not a period later.
//!
//! What it costs: one `clock_gettime` per session worker a period (a microsecond or so
//! each), and no wake-up at all while no session worker is watched. What it allows: a
//! worker may overrun its budget by up to a period of CPU time for each core its threads
//! keep busy before it is found; the kernel's limit for its whole life stays behind it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::cpu_budget::{Account, Spent, cpu_time};

/// How often the watchdog reads every session worker's CPU clock.
pub(super) const PERIOD: Duration = Duration::from_millis(250);

/// The session workers watched, and the task's wake-up when the first arrives.
#[derive(Debug, Default)]
pub(super) struct Watchdog {
    watched: Mutex<Vec<Weak<Watched>>>,
    first: Notify,
}

impl Watchdog {
    /// Watches worker `pid` (signalled through `pidfd`), from its fork, under `account`,
    /// for as long as the returned watch is held.
    pub(super) fn watch(&self, pid: i32, pidfd: OwnedFd, account: Account) -> Arc<Watched> {
        let watched = Arc::new(Watched {
            pid,
            pidfd,
            state: Mutex::new(State {
                limit: account.initial_limit(),
                account,
                spending: Spent::Between,
                killed: None,
            }),
        });
        lock(&self.watched).push(Arc::downgrade(&watched));
        self.first.notify_one();
        watched
    }

    /// Reads every watched worker's CPU clock each [`PERIOD`] (waiting while none is
    /// watched), until `shutdown`.
    pub(super) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if self.watching().is_empty() {
                tokio::select! {
                    () = self.first.notified() => {}
                    () = shutdown.cancelled() => return,
                }
            }
            tokio::select! {
                () = tokio::time::sleep(PERIOD) => {}
                () = shutdown.cancelled() => return,
            }
            for watched in self.watching() {
                watched.check();
            }
        }
    }

    /// The workers watched now; the watches dropped since are forgotten.
    fn watching(&self) -> Vec<Arc<Watched>> {
        let mut watched = lock(&self.watched);
        watched.retain(|w| w.strong_count() > 0);
        watched.iter().filter_map(Weak::upgrade).collect()
    }
}

/// One session worker under the watchdog.
#[derive(Debug)]
pub(super) struct Watched {
    pid: i32,
    pidfd: OwnedFd,
    /// Held while its clock is read and compared, so a request's start never moves the
    /// limit between the watchdog's reading and its kill.
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    account: Account,
    /// The CPU time past which it is killed.
    limit: Duration,
    /// The budget `limit` is the end of.
    spending: Spent,
    /// The budget it was killed for, once it was.
    killed: Option<Spent>,
}

impl Watched {
    /// Before a request: a whole budget from now, unless it is already over the one
    /// between requests (then it is killed).
    pub(super) fn start_request(&self) -> io::Result<()> {
        let mut state = lock(&self.state);
        if state.killed.is_some() {
            return Ok(());
        }
        let used = cpu_time(self.pid)?;
        if used > state.limit {
            return self.kill(&mut state);
        }
        state.limit = state.account.start_request(used);
        state.spending = Spent::Request;
        Ok(())
    }

    /// After a request: what is left of the budget between requests. What the request
    /// used past its own budget before it ended is not counted against that one.
    pub(super) fn end_request(&self) -> io::Result<()> {
        let mut state = lock(&self.state);
        if state.killed.is_some() {
            return Ok(());
        }
        let used = cpu_time(self.pid)?;
        state.limit = state.account.end_request(used);
        state.spending = Spent::Between;
        Ok(())
    }

    /// The budget the watchdog killed it for, if it did.
    pub(super) fn killed(&self) -> Option<Spent> {
        lock(&self.state).killed
    }

    /// Kills it if it is over its limit. A clock that cannot be read is a worker gone.
    fn check(&self) {
        let mut state = lock(&self.state);
        if state.killed.is_some() {
            return;
        }
        if cpu_time(self.pid).is_ok_and(|used| used > state.limit) {
            let _ = self.kill(&mut state);
        }
    }

    fn kill(&self, state: &mut State) -> io::Result<()> {
        tracing::info!(
            pid = self.pid,
            spent = ?state.spending,
            "a session worker used up its CPU-time budget; killing it"
        );
        state.killed = Some(state.spending);
        super::worker::pidfd_kill(self.pidfd.as_fd())
    }
}

/// A poisoned lock only means a panic elsewhere; the data is still whole.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command};

    use super::*;

    /// A process that spins on the CPU until it is killed: by the watchdog or, should a
    /// test fail, when this is dropped.
    struct Spinner(Child);

    impl Drop for Spinner {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A [`Spinner`], its pid and a pidfd of it.
    fn spinner() -> (Spinner, i32, OwnedFd) {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let pidfd = snakecage_worker::fdpass::pidfd_open(pid).unwrap();
        (Spinner(child), pid, pidfd)
    }

    /// Waits for `spinner` to die (for two minutes at most: a bound against a hang, not a
    /// timing), and the signal that killed it.
    async fn death(mut spinner: Spinner) -> Option<i32> {
        for _ in 0..1200 {
            if let Some(status) = spinner.0.try_wait().unwrap() {
                return status.signal();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the worker was not killed");
    }

    const BUDGET: Duration = Duration::from_millis(200);

    /// Between requests and during one, a worker over its budget is killed by the task,
    /// which says which budget it was.
    #[tokio::test]
    async fn the_task_kills_a_worker_over_its_budget_and_says_which() {
        let watchdog = Arc::new(Watchdog::default());
        let stop = CancellationToken::new();
        tokio::spawn(watchdog.clone().run(stop.clone()));

        let (child, pid, pidfd) = spinner();
        let between = watchdog.watch(pid, pidfd, Account::new(BUDGET));
        assert_eq!(death(child).await, Some(libc::SIGKILL));
        assert_eq!(between.killed(), Some(Spent::Between));

        let (child, pid, pidfd) = spinner();
        let request = watchdog.watch(pid, pidfd, Account::new(BUDGET));
        request.start_request().unwrap();
        assert_eq!(death(child).await, Some(libc::SIGKILL));
        assert_eq!(request.killed(), Some(Spent::Request));
        stop.cancel();
    }

    /// A worker found over its budget between requests when the next one starts is killed
    /// then, whether or not the task has come round.
    #[tokio::test]
    async fn a_request_to_a_worker_over_its_budget_between_requests_kills_it() {
        let watchdog = Watchdog::default();
        let (child, pid, pidfd) = spinner();
        let watched = watchdog.watch(pid, pidfd, Account::new(BUDGET));
        while cpu_time(pid).unwrap() <= BUDGET {
            tokio::task::yield_now().await;
        }
        watched.start_request().unwrap();
        assert_eq!(watched.killed(), Some(Spent::Between));
        assert_eq!(death(child).await, Some(libc::SIGKILL));
        // A watch dropped is forgotten.
        drop(watched);
        assert!(watchdog.watching().is_empty());
    }
}
