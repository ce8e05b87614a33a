//! The CPU-time backstop of a session's worker (`RLIMIT_CPU`), renewed for each request.
//!
//! Every worker starts with `limits.max_timeout_ms` and a second of CPU time (SIGXCPU
//! there, SIGKILL a second later): a backstop behind the wall-clock deadline. A stateless
//! worker runs one job, so that is its job's budget. A session's worker serves many runs,
//! and left alone that budget would be for its whole life: a busy session would be killed
//! on a run well within its own timeout, its state lost. So the supervisor moves the
//! limit before each request it sends the worker (a run, a reset, a listing of its
//! variables) to the CPU time used so far plus one budget, and after it back to what is
//! left of one more budget for all the worker does between requests: threads a run left
//! running go on burning CPU while no deadline watches them, and together they still get
//! one budget for the worker's life, as before.
//!
//! Only the supervisor can: raising a hard limit takes CAP_SYS_RESOURCE in the host's
//! initial user namespace (whatever namespace the process is in), which a worker (and the
//! code it runs) never has, so user code can raise its soft limit to the hard one, a second
//! further, and no further; and the workers' seccomp policy denies `prlimit64` on any
//! process but the caller. Without the capability (a supervisor that is not root, a
//! container that drops it, a user-namespaced pod) the limit stays as the worker started
//! with it, one budget for the session's life, and `/health` says so ([`Scope`]).

use std::io;
use std::sync::OnceLock;
use std::time::Duration;

use nix::time::{ClockId, clock_getcpuclockid, clock_gettime};
use nix::unistd::Pid;
use serde::Serialize;

/// What one CPU-time budget of a session's worker covers on this host (`/health` →
/// `sessions.cpu_budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Each request (run, reset, listing), and all the worker does between them together.
    PerRun,
    /// The session's whole life: this process may not raise hard limits.
    PerLife,
    /// Nothing: the `rlimits` sandbox layer is switched off, workers have no CPU limit.
    Off,
}

impl Scope {
    /// Per run when this process may raise the workers' limits, decided once (the
    /// capabilities of a running process do not come back) and said once when it may not.
    pub fn here() -> Scope {
        static SCOPE: OnceLock<Scope> = OnceLock::new();
        *SCOPE.get_or_init(|| {
            if snakecage_worker::capability::can_raise_hard_limits() {
                Scope::PerRun
            } else {
                tracing::warn!(
                    "no CAP_SYS_RESOURCE in the initial user namespace: a session's worker \
                     gets one CPU-time budget (limits.max_timeout_ms and a second) for its \
                     whole life, not one per run"
                );
                Scope::PerLife
            }
        })
    }
}

/// One session worker's budget, renewed around each request when its scope is per run.
#[derive(Debug)]
pub(super) struct CpuBudget {
    pid: i32,
    scope: Scope,
    /// The CPU time a worker starts with: what each request gets, and what everything
    /// between requests gets in all.
    per_request: Duration,
    /// CPU time used between requests so far (from the worker's fork: its warm-up too).
    between: Duration,
    /// The worker's CPU time when it was last measured, at a request's start or end.
    measured: Duration,
}

impl CpuBudget {
    /// The budget of session worker `pid`, which started with `seconds` of CPU time.
    pub(super) fn new(pid: i32, seconds: u64, scope: Scope) -> Self {
        Self {
            pid,
            scope,
            per_request: Duration::from_secs(seconds),
            between: Duration::ZERO,
            measured: Duration::ZERO,
        }
    }

    /// Before a request: a whole budget from now. What the worker used since the last
    /// request ended counts against the budget between requests.
    pub(super) fn start_request(&mut self) -> io::Result<()> {
        if self.scope != Scope::PerRun {
            return Ok(());
        }
        let used = cpu_time(self.pid)?;
        self.between += used.saturating_sub(self.measured);
        self.measured = used;
        set_limit(self.pid, used + self.per_request)
    }

    /// After a request, its worker alive: what is left of the budget between requests.
    pub(super) fn end_request(&mut self) -> io::Result<()> {
        if self.scope != Scope::PerRun {
            return Ok(());
        }
        let used = cpu_time(self.pid)?;
        self.measured = used;
        set_limit(
            self.pid,
            used + self.per_request.saturating_sub(self.between),
        )
    }

    /// The reason of a worker killed by this budget (SIGXCPU).
    pub(super) fn exhausted(&self, signal: i32) -> String {
        let seconds = self.per_request.as_secs();
        let budget = match self.scope {
            Scope::PerRun => format!(
                "limits.max_timeout_ms and a second, {seconds} s, for each run, and as much \
                 in all for what it does between runs"
            ),
            Scope::PerLife => format!(
                "limits.max_timeout_ms and a second, {seconds} s, for the session's whole \
                 life: the service lacks CAP_SYS_RESOURCE to renew it for each run"
            ),
            Scope::Off => "a limit the service did not set: its rlimits layer is off".into(),
        };
        format!(
            "its worker used up its CPU time ({budget}) and was killed by signal {signal} (SIGXCPU)"
        )
    }
}

/// The CPU time process `pid` has used, all its threads together: what `RLIMIT_CPU`
/// counts.
pub(super) fn cpu_time(pid: i32) -> io::Result<Duration> {
    let clock: ClockId = clock_getcpuclockid(Pid::from_raw(pid))?;
    let now = clock_gettime(clock)?;
    Ok(Duration::new(now.tv_sec() as u64, now.tv_nsec() as u32))
}

/// `RLIMIT_CPU` of `pid`: SIGXCPU once it has used `total` (rounded up to the second,
/// the limit's unit), SIGKILL a second later.
fn set_limit(pid: i32, total: Duration) -> io::Result<()> {
    let soft = total.as_nanos().div_ceil(1_000_000_000) as u64;
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: soft + 1,
    };
    // SAFETY: prlimit with a pid, a resource number, a valid rlimit and no old-limit
    // pointer; it reads `limit` and writes nothing.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_CPU, &limit, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Soft and hard `RLIMIT_CPU` of `pid`, from `/proc`.
    fn limits_of(pid: i32) -> (u64, u64) {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max cpu time"))
            .unwrap();
        let mut words = line
            .split_whitespace()
            .skip(3)
            .map(|w| w.parse().unwrap_or(libc::RLIM_INFINITY));
        (words.next().unwrap(), words.next().unwrap())
    }

    /// The limit `pid` gets for `left` more CPU time from what it used so far.
    fn expected(pid: i32, left: Duration) -> (u64, u64) {
        let soft = (cpu_time(pid).unwrap() + left)
            .as_nanos()
            .div_ceil(1_000_000_000) as u64;
        (soft, soft + 1)
    }

    /// A request gets a whole budget from what the process used so far; between requests
    /// it gets what is left of one budget for all its time between them, never less than
    /// nothing. Without CAP_SYS_RESOURCE the limit cannot be raised, and is not touched.
    #[test]
    fn each_request_gets_a_budget_and_the_time_between_them_one_in_all() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let before = limits_of(pid);
        let mut budget = CpuBudget::new(pid, 5, Scope::PerRun);
        if !snakecage_worker::capability::can_raise_hard_limits() {
            // Raising the hard limit from unlimited is not asked; from a finite one it is.
            set_limit(pid, Duration::from_secs(3)).unwrap();
            let err = budget.start_request().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
            assert_eq!(limits_of(pid), (3, 4));
        } else {
            budget.start_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, Duration::from_secs(5)));
            // As if the worker had used 4 s between requests before this one.
            budget.between = Duration::from_secs(4);
            budget.end_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, Duration::from_secs(1)));
            budget.between = Duration::from_secs(9);
            budget.end_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, Duration::ZERO));
            // The next request's budget is above the hard limit between requests.
            budget.start_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, Duration::from_secs(5)));
        }
        // A budget for the session's life is left as the worker started with it.
        let mut life = CpuBudget::new(pid, 5, Scope::PerLife);
        let now = limits_of(pid);
        life.start_request().unwrap();
        life.end_request().unwrap();
        assert_eq!(limits_of(pid), now);
        assert_ne!(before, now);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
