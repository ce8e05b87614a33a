//! The CPU-time budget of a session's worker: `limits.max_timeout_ms` and a second for each
//! request (a run, a reset, a listing of its variables), and as much in all for what it
//! does between requests (threads a run left running go on burning CPU while no deadline
//! watches them). A stateless worker runs one job, so the `RLIMIT_CPU` it runs it under is
//! its budget; a session's worker serves many runs, and one budget for its whole life
//! would kill a busy session on a run well within its own timeout, its state lost.
//!
//! Who enforces it ([`Enforcement`]) depends on one capability. Raising a hard limit takes
//! CAP_SYS_RESOURCE in the host's initial user namespace (whatever namespace the process is
//! in), which a worker, and the code it runs, never has: user code can raise its soft limit
//! to the hard one and no further, and the workers' seccomp policy denies `prlimit64` on
//! any process but the caller.
//!
//! - With the capability, the kernel: the supervisor moves the worker's limit before each
//!   request to the CPU time used so far plus one budget (SIGXCPU there, SIGKILL a second
//!   later), and after it to what is left of the budget between requests.
//! - Without it (a container that drops it, a user-namespaced pod, a root whose bounding
//!   set lacks it), the supervisor's watchdog ([`super::cpu_watchdog`]). The supervisor
//!   may not move a worker's limits then, nor even read them once the worker has dropped
//!   to its own uid, but it may read its CPU clock: at each request's start and end and
//!   every [`super::cpu_watchdog::PERIOD`] in between, killing a worker over its budget.
//!   The kernel's limit of a session's worker is its CPU time for its whole life
//!   (`limits.max_session_cpu_seconds`), the last backstop should the supervisor be stuck;
//!   every worker starts with it, and a stateless one lowers it to one job's itself
//!   before its job runs (`rlimits::for_one_job` in the worker).

use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::time::{ClockId, clock_getcpuclockid, clock_gettime};
use nix::unistd::Pid;

use super::cpu_watchdog::{Watchdog, Watched};

/// Who enforces the budget of each request of a session's worker on this host (`/health`
/// → `sessions.cpu_budget` and `sessions.cpu_budget_enforced_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// The kernel (`RLIMIT_CPU`), moved around each request by the supervisor.
    Kernel,
    /// The supervisor's watchdog; the kernel's limit is for the worker's whole life.
    Watchdog,
    /// Nobody: the `rlimits` sandbox layer is switched off, workers have no CPU limit.
    Off,
}

impl Enforcement {
    /// The kernel when this process may raise the workers' limits, else the watchdog:
    /// decided once (the capabilities of a running process do not come back), and said
    /// once when it is the watchdog.
    pub fn here() -> Enforcement {
        static HERE: OnceLock<Enforcement> = OnceLock::new();
        *HERE.get_or_init(|| {
            if snakecage_worker::capability::can_raise_hard_limits() {
                Enforcement::Kernel
            } else {
                tracing::info!(
                    "no CAP_SYS_RESOURCE in the initial user namespace: the service enforces \
                     a session worker's CPU-time budget for each run itself (it kills a worker \
                     over it), and the kernel's limit is limits.max_session_cpu_seconds for \
                     the worker's whole life"
                );
                Enforcement::Watchdog
            }
        })
    }

    /// What one budget covers: `per_run`, or `off`.
    pub fn scope(self) -> &'static str {
        match self {
            Enforcement::Kernel | Enforcement::Watchdog => "per_run",
            Enforcement::Off => "off",
        }
    }

    /// Who enforces it: `kernel` or `watchdog`; nobody when it is off.
    pub fn enforced_by(self) -> Option<&'static str> {
        match self {
            Enforcement::Kernel => Some("kernel"),
            Enforcement::Watchdog => Some("watchdog"),
            Enforcement::Off => None,
        }
    }
}

/// The budgets of a generation's session workers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Terms {
    pub enforcement: Enforcement,
    /// One request's budget, and the budget between requests in all (`RLIMIT_CPU` of a
    /// stateless worker).
    pub seconds: u64,
    /// The kernel's limit for a session worker's whole life, under the watchdog.
    pub life_seconds: Option<u64>,
}

/// Which budget a worker killed for its CPU time had used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spent {
    /// The one of the request it was serving.
    Request,
    /// The one for all it does between requests.
    Between,
}

/// What a session's worker has used of its budgets, from its CPU time measured at the
/// start and end of each request.
#[derive(Debug)]
pub(super) struct Account {
    per_request: Duration,
    /// CPU time used between requests so far (from the worker's fork: its warm-up too).
    between: Duration,
    /// The worker's CPU time when it was last measured, at a request's start or end.
    measured: Duration,
}

impl Account {
    pub(super) fn new(per_request: Duration) -> Self {
        Self {
            per_request,
            between: Duration::ZERO,
            measured: Duration::ZERO,
        }
    }

    /// The CPU time the worker may use before any request: one budget from its fork.
    pub(super) fn initial_limit(&self) -> Duration {
        self.per_request
    }

    /// A request starts, the worker having used `used`: what it used since the last one
    /// ended counts against the budget between requests. The CPU time it may reach during
    /// the request: a whole budget from now.
    pub(super) fn start_request(&mut self, used: Duration) -> Duration {
        self.between += used.saturating_sub(self.measured);
        self.measured = used;
        used + self.per_request
    }

    /// A request ended, the worker alive, having used `used`: the CPU time it may reach
    /// before the next one, what is left of the budget between requests.
    pub(super) fn end_request(&mut self, used: Duration) -> Duration {
        self.measured = used;
        used + self.per_request.saturating_sub(self.between)
    }
}

/// One session worker's budget.
#[derive(Debug)]
pub(super) struct CpuBudget {
    terms: Terms,
    enforcer: Enforcer,
}

#[derive(Debug)]
enum Enforcer {
    /// Its `RLIMIT_CPU`, moved by this process.
    Kernel {
        pid: i32,
        account: Account,
    },
    /// The watchdog's watch over it (none for a worker without a pidfd: it could not be
    /// killed without the risk of hitting a recycled pid, and keeps its life's limit).
    Watchdog(Option<Arc<Watched>>),
    Off,
}

impl CpuBudget {
    /// The budget of session worker `pid` (signalled through `pidfd`), on `terms`; under
    /// the watchdog, watched from now on, until it is dropped.
    pub(super) fn new(
        pid: i32,
        pidfd: Option<std::os::fd::OwnedFd>,
        terms: Terms,
        watchdog: &Watchdog,
    ) -> Self {
        let account = Account::new(Duration::from_secs(terms.seconds));
        let enforcer = match terms.enforcement {
            Enforcement::Kernel => Enforcer::Kernel { pid, account },
            Enforcement::Watchdog => Enforcer::Watchdog(match pidfd {
                Some(pidfd) => Some(watchdog.watch(pid, pidfd, account)),
                None => {
                    tracing::warn!(
                        pid,
                        "a session worker without a pidfd (kernel before 5.3) cannot be \
                         killed safely by the CPU-time watchdog: it keeps only the limit for \
                         its whole life (limits.max_session_cpu_seconds)"
                    );
                    None
                }
            }),
            Enforcement::Off => Enforcer::Off,
        };
        Self { terms, enforcer }
    }

    /// Before a request: a whole budget from now. A worker found over its budget between
    /// requests (its watchdog not yet round) is killed now.
    pub(super) fn start_request(&mut self) -> io::Result<()> {
        match &mut self.enforcer {
            Enforcer::Kernel { pid, account } => {
                let limit = account.start_request(cpu_time(*pid)?);
                set_limit(*pid, limit)
            }
            Enforcer::Watchdog(Some(watched)) => watched.start_request(),
            Enforcer::Watchdog(None) | Enforcer::Off => Ok(()),
        }
    }

    /// After a request, its worker alive: what is left of the budget between requests.
    pub(super) fn end_request(&mut self) -> io::Result<()> {
        match &mut self.enforcer {
            Enforcer::Kernel { pid, account } => {
                let limit = account.end_request(cpu_time(*pid)?);
                set_limit(*pid, limit)
            }
            Enforcer::Watchdog(Some(watched)) => watched.end_request(),
            Enforcer::Watchdog(None) | Enforcer::Off => Ok(()),
        }
    }

    /// Whether the watchdog killed its worker.
    pub(super) fn watchdog_killed(&self) -> bool {
        matches!(&self.enforcer, Enforcer::Watchdog(Some(w)) if w.killed().is_some())
    }

    /// Why its worker, found dead by `signal` (its exit status's, if known), died of
    /// its CPU time, if it did: `in_request` whether it was serving one.
    pub(super) fn why_killed(&self, signal: Option<i32>, in_request: bool) -> Option<String> {
        let xcpu = signal == Some(libc::SIGXCPU);
        let by_kernel = "was killed by signal 24 (SIGXCPU)";
        let spent = match &self.enforcer {
            Enforcer::Kernel { .. } if xcpu => {
                let spent = if in_request {
                    Spent::Request
                } else {
                    Spent::Between
                };
                return Some(self.used_up(spent, by_kernel));
            }
            Enforcer::Watchdog(watched) => watched.as_ref().and_then(|w| w.killed()),
            Enforcer::Off if xcpu => {
                return Some(format!(
                    "its worker used up a CPU-time limit the service did not set (its rlimits \
                     layer is off) and {by_kernel}"
                ));
            }
            Enforcer::Kernel { .. } | Enforcer::Off => None,
        };
        match (spent, self.terms.life_seconds) {
            (Some(spent), _) => Some(self.used_up(spent, "the service killed it (SIGKILL)")),
            (None, Some(life)) if xcpu => Some(format!(
                "its worker used up its CPU time for the session's whole life ({life} s: \
                 limits.max_session_cpu_seconds) and {by_kernel}"
            )),
            (None, _) => None,
        }
    }

    fn used_up(&self, spent: Spent, killed: &str) -> String {
        let seconds = self.terms.seconds;
        let budget = match spent {
            Spent::Request => {
                format!("for one request ({seconds} s: limits.max_timeout_ms and a second)")
            }
            Spent::Between => format!(
                "between requests ({seconds} s in all: limits.max_timeout_ms and a second; \
                 threads a run left running use it)"
            ),
        };
        format!("its worker used up its CPU time {budget} and {killed}")
    }
}

/// The CPU time process `pid` has used, all its threads together: what `RLIMIT_CPU`
/// counts. Any process's may be read, whatever its uid.
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

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A request may reach a whole budget from its start; between requests the worker
    /// may reach what is left of one budget for all its time between them (from its fork),
    /// never less than nothing.
    #[test]
    fn each_request_gets_a_budget_and_the_time_between_them_one_in_all() {
        let mut account = Account::new(secs(5));
        assert_eq!(account.initial_limit(), secs(5));
        // 2 s used before the first request: between requests.
        assert_eq!(account.start_request(secs(2)), secs(7));
        // The request used 4 s: 3 s left between requests.
        assert_eq!(account.end_request(secs(6)), secs(9));
        // 2 more between them: 1 s left, whatever the request after used.
        assert_eq!(account.start_request(secs(8)), secs(13));
        assert_eq!(account.end_request(secs(12)), secs(13));
        // 9 more between them: nothing left.
        assert_eq!(account.start_request(secs(21)), secs(26));
        assert_eq!(account.end_request(secs(21)), secs(21));
    }

    fn kernel(pid: i32, seconds: u64) -> CpuBudget {
        let terms = Terms {
            enforcement: Enforcement::Kernel,
            seconds,
            life_seconds: None,
        };
        CpuBudget::new(pid, None, terms, &Watchdog::default())
    }

    /// The kernel's limit, moved around each request. Without CAP_SYS_RESOURCE this
    /// process may not raise it, and a service without it never asks (the watchdog).
    #[test]
    fn the_kernel_limit_is_moved_for_each_request_by_a_process_that_may_raise_it() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut budget = kernel(pid, 5);
        if !snakecage_worker::capability::can_raise_hard_limits() {
            // Raising the hard limit from unlimited is not asked; from a finite one it is.
            set_limit(pid, secs(3)).unwrap();
            let err = budget.start_request().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
            assert_eq!(limits_of(pid), (3, 4));
        } else {
            budget.start_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, secs(5)));
            let Enforcer::Kernel { account, .. } = &mut budget.enforcer else {
                unreachable!()
            };
            // As if the worker had used 4 s between requests before this one.
            account.between = secs(4);
            budget.end_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, secs(1)));
            let Enforcer::Kernel { account, .. } = &mut budget.enforcer else {
                unreachable!()
            };
            account.between = secs(9);
            budget.end_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, Duration::ZERO));
            // The next request's budget is above the hard limit between requests.
            budget.start_request().unwrap();
            assert_eq!(limits_of(pid), expected(pid, secs(5)));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Each death of CPU time says which budget was used up and who killed the worker;
    /// another death is none of the budget's business.
    #[test]
    fn a_worker_killed_for_its_cpu_time_says_which_budget_and_by_whom() {
        let xcpu = Some(libc::SIGXCPU);
        let kernel = kernel(1, 3);
        assert_eq!(
            kernel.why_killed(xcpu, true).unwrap(),
            "its worker used up its CPU time for one request (3 s: limits.max_timeout_ms \
             and a second) and was killed by signal 24 (SIGXCPU)"
        );
        assert_eq!(
            kernel.why_killed(xcpu, false).unwrap(),
            "its worker used up its CPU time between requests (3 s in all: \
             limits.max_timeout_ms and a second; threads a run left running use it) and was \
             killed by signal 24 (SIGXCPU)"
        );
        assert_eq!(kernel.why_killed(Some(libc::SIGKILL), true), None);
        assert_eq!(kernel.why_killed(None, false), None);

        // Under the watchdog a worker without a pidfd is not watched: only its life's
        // limit, the kernel's, can kill it for its CPU time.
        let terms = Terms {
            enforcement: Enforcement::Watchdog,
            seconds: 3,
            life_seconds: Some(60),
        };
        let unwatched = CpuBudget::new(1, None, terms, &Watchdog::default());
        assert_eq!(
            unwatched.why_killed(xcpu, true).unwrap(),
            "its worker used up its CPU time for the session's whole life (60 s: \
             limits.max_session_cpu_seconds) and was killed by signal 24 (SIGXCPU)"
        );
        assert_eq!(unwatched.why_killed(Some(libc::SIGKILL), true), None);

        let off = CpuBudget::new(
            1,
            None,
            Terms {
                enforcement: Enforcement::Off,
                ..terms
            },
            &Watchdog::default(),
        );
        assert_eq!(
            off.why_killed(xcpu, false).unwrap(),
            "its worker used up a CPU-time limit the service did not set (its rlimits layer \
             is off) and was killed by signal 24 (SIGXCPU)"
        );
        assert_eq!(off.why_killed(Some(libc::SIGKILL), false), None);
    }
}
