//! Telling a worker that is starved of CPU from one that is stuck.
//!
//! Workers are forked and warmed up at background priority (`SCHED_IDLE`) while no job
//! waits for them. On a host whose CPUs are kept busy by normal-priority processes (a
//! build, another service) such a worker gets almost no CPU and can take longer than
//! `pool.spawn_timeout_ms` to say Ready. Killing it then only throws away the CPU it had,
//! and counting it as a failed spawn turns `/health` degraded on a machine where nothing
//! is broken. A stuck worker sleeps (in a call that never returns) or is stopped, or it
//! spins and gets the CPU it asks for; a starved one is runnable, or waits uninterruptibly
//! in the kernel for a lock another starved process holds (joining the instance's cgroup
//! takes the kernel's `cgroup_mutex`: a worker at `SCHED_IDLE` holding it beside busy
//! normal-priority processes keeps the next workers in state `D`), and got little CPU.
//! The kernel reports both: the process's state in `/proc/PID/stat` and its
//! CPU-time clock (read as a session's CPU budget reads it). (The time it waited on a run
//! queue, `/proc/PID/schedstat`'s second field, is no help: it is added up only when the
//! task next gets a CPU.)

use std::time::Duration;

/// What the kernel says about a task's scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SchedStat {
    /// Time spent on a CPU.
    pub on_cpu: Duration,
    /// Held back rather than asleep or stopped: running or waiting for a CPU (state `R`),
    /// or in an uninterruptible wait in the kernel (`D`).
    pub held: bool,
}

impl SchedStat {
    /// A process just forked: no CPU time yet.
    pub const FORKED: Self = Self {
        on_cpu: Duration::ZERO,
        held: true,
    };

    /// The state and CPU time of process `pid` (a worker has one thread while it starts);
    /// `None` when it is gone.
    pub fn of(pid: i32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some(Self {
            on_cpu: super::cpu_budget::cpu_time(pid).ok()?,
            held: held(&stat)?,
        })
    }
}

/// Whether a `/proc/PID/stat` line says running or waiting for a CPU (state `R`) or in an
/// uninterruptible wait (`D`). The state follows the last `)`: the name before it may
/// hold spaces and parentheses.
fn held(stat: &str) -> Option<bool> {
    Some(["R", "D"].contains(&state(stat)?))
}

/// The state letter of a `/proc/PID/stat` line.
fn state(stat: &str) -> Option<&str> {
    stat[stat.rfind(')')? + 1..].split_ascii_whitespace().next()
}

/// Where process `pid` waits, for a report of a worker that was not ready in time: its
/// state (`R`unnable, `S`leeping, `D` in the kernel uninterruptibly, …) and, asleep, the
/// kernel function it sleeps in (`/proc/PID/wchan`, when the kernel shows it).
pub(super) fn waiting_in(pid: i32) -> String {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return "gone".into();
    };
    let state = state(&stat).unwrap_or("?");
    match std::fs::read_to_string(format!("/proc/{pid}/wchan")) {
        Ok(wchan) if !["", "0"].contains(&wchan.trim()) => {
            format!("state {state} in {}", wchan.trim())
        }
        _ => format!("state {state}"),
    }
}

/// Whether a worker that was not ready after `period` was held back by the host rather
/// than stuck: it is runnable now, or waits uninterruptibly in the kernel, and had less
/// than half of the period on a CPU.
pub(super) fn starved(
    before: Option<SchedStat>,
    after: Option<SchedStat>,
    period: Duration,
) -> bool {
    match (before, after) {
        (Some(before), Some(after)) => {
            after.held && after.on_cpu.saturating_sub(before.on_cpu) < period / 2
        }
        _ => false,
    }
}

/// How long a starved worker is waited for in all before it is killed anyway (the host
/// may never free a CPU for it): ten periods of `pool.spawn_timeout_ms`, at least a minute.
pub(super) fn patience(period: Duration) -> Duration {
    (period * 10).max(Duration::from_secs(60))
}

/// Awaits `wanted` (what a process is to report: a worker's exit, which its zygote
/// reaps and reports) for `period`, and period after period while `sample` (the processes
/// it waits on, as [`SchedStat::of`] reads them) shows one of them runnable but starved
/// ([`starved`]), up to [`patience`] in all. The zygote reaps and reports at `SCHED_IDLE`
/// and a killed worker tears down its memory at the priority it had: on a host busy with
/// normal-priority work either can be held back for seconds, and a report that would
/// come is not given up for lost. `None` when it did not come: those processes were
/// sleeping or stopped (nothing is on its way), or patience ran out.
pub(super) async fn while_starved<F: Future + Unpin>(
    mut wanted: F,
    period: Duration,
    mut sample: impl FnMut() -> [Option<SchedStat>; 2],
) -> Option<F::Output> {
    let mut before = sample();
    let mut waited = Duration::ZERO;
    loop {
        if let Ok(got) = tokio::time::timeout(period, &mut wanted).await {
            return Some(got);
        }
        waited += period;
        let after = sample();
        let held_back = (before.iter().zip(&after)).any(|(b, a)| starved(*b, *a, period));
        if !held_back || waited + period > patience(period) {
            return None;
        }
        before = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(on_cpu_ms: u64, held: bool) -> Option<SchedStat> {
        Some(SchedStat {
            on_cpu: Duration::from_millis(on_cpu_ms),
            held,
        })
    }

    #[test]
    fn reads_the_state_after_the_name() {
        let stat = "4242 (snake (cage) R) S 1 4242 4242 0 -1 4194560 96 0 0 0";
        assert_eq!(held(stat), Some(false));
        assert_eq!(held("4242 (python) R 1 4242"), Some(true));
        assert_eq!(held("4242 (python) D 1 4242"), Some(true));
        assert_eq!(held("4242 (python) T 1 4242"), Some(false));
        assert_eq!(held("4242 python R"), None);
    }

    #[test]
    fn a_runnable_worker_that_got_little_cpu_is_starved() {
        let period = Duration::from_secs(30);
        assert!(starved(stat(5, true), stat(40, true), period));
        assert!(starved(stat(5, false), stat(15_004, true), period));
        // Counted from the fork: the whole life of a worker that never got half a period.
        assert!(starved(Some(SchedStat::FORKED), stat(14_999, true), period));
        assert!(!starved(
            Some(SchedStat::FORKED),
            stat(15_000, true),
            period
        ));
        // Asleep or stopped: stuck, whatever CPU it had.
        assert!(!starved(stat(5, true), stat(5, false), period));
        // Spinning with the CPU it asks for: stuck too.
        assert!(!starved(stat(5, true), stat(15_005, true), period));
        // Gone, or no schedstats: not starved (it is killed as before).
        assert!(!starved(None, stat(1, true), period));
        assert!(!starved(stat(1, true), None, period));
    }

    /// A report held back by a starved process is waited for, period after period, until
    /// it comes; one from processes that sleep (nothing is on its way) is given up after
    /// the first period. Decided by what is sampled, not by how long anything took.
    #[tokio::test]
    async fn a_report_is_awaited_while_the_processes_it_waits_on_are_starved() {
        let period = Duration::from_millis(10);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut tx = Some(tx);
        let mut samples = 0;
        let got = while_starved(rx, period, || {
            samples += 1;
            // The fourth sample (three periods gone): the zygote has had its CPU at last.
            if samples == 4 {
                tx.take().unwrap().send(9).unwrap();
            }
            [stat(5, false), stat(7, true)]
        })
        .await;
        assert_eq!(got, Some(Ok(9)));

        let (_tx, rx) = tokio::sync::oneshot::channel::<i32>();
        let mut samples = 0;
        let got = while_starved(rx, period, || {
            samples += 1;
            [None, stat(7, false)]
        })
        .await;
        assert_eq!(got, None);
        assert_eq!(samples, 2);
    }

    /// What the kernel reports: a process kept runnable at `SCHED_IDLE` on the CPU of a
    /// busy normal-priority thread is starved, a stopped one is not.
    #[test]
    fn the_kernel_tells_a_starved_process_from_a_stopped_one() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cpu = 0;
        let pin = move |pid: i32| {
            // SAFETY: a zeroed cpu_set_t with one bit set, passed by pointer with its size.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(pid, std::mem::size_of_val(&set), &set),
                    0,
                    "{}",
                    std::io::Error::last_os_error()
                );
            }
        };
        // Two children that spin, one of them stopped (and seen stopped, while it still
        // runs at normal priority) at once; then both at SCHED_IDLE, set from here so that
        // it is in force before anything is measured.
        let spin = || {
            // SAFETY: the child makes no call at all and spins until it is killed.
            match unsafe { libc::fork() } {
                0 => loop {
                    std::hint::spin_loop();
                },
                pid => {
                    assert!(pid > 0);
                    pid
                }
            }
        };
        let runnable = spin();
        let stopped = spin();
        // SAFETY: a signal to our own child, then a wait for it to have stopped.
        unsafe {
            libc::kill(stopped, libc::SIGSTOP);
            let mut status = 0;
            assert_eq!(
                libc::waitpid(stopped, &mut status, libc::WUNTRACED),
                stopped
            );
            assert!(libc::WIFSTOPPED(status));
        }
        for pid in [runnable, stopped] {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: sched_setscheduler on our own child with a valid parameter.
            let set = unsafe { libc::sched_setscheduler(pid, libc::SCHED_IDLE, &param) };
            assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
        }
        pin(runnable);
        pin(stopped);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let hog = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin(0);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let period = Duration::from_millis(400);
        let before = (SchedStat::of(runnable), SchedStat::of(stopped));
        std::thread::sleep(period);
        let after = (SchedStat::of(runnable), SchedStat::of(stopped));
        stop.store(true, Ordering::Relaxed);
        hog.join().unwrap();
        for pid in [runnable, stopped] {
            // SAFETY: our own children, killed and reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        assert!(
            starved(before.0, after.0, period),
            "runnable: {before:?} -> {after:?}"
        );
        assert!(
            !starved(before.1, after.1, period),
            "stopped: {before:?} -> {after:?}"
        );
    }
}
