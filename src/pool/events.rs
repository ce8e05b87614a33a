//! What the pool reports as it works (queue waits, rejections, spawns, kills, zygote
//! restarts), for whoever measures it. A trait, so the pool does not depend on how it is
//! measured: the server passes the metrics in, tests and benches can pass [`NoEvents`].

use std::time::Duration;

/// Receives the pool's events. Every method is cheap and must not block: they are called
/// on the request path and from the refill task.
pub trait PoolEvents: Send + Sync + 'static {
    /// A request got its worker after waiting `waited` (zero when one was free at once),
    /// or gave up after waiting that long (`rejected(QueueTimeout)` follows).
    fn queue_wait(&self, waited: Duration);
    /// A request was turned away without running.
    fn rejected(&self, reason: Rejection);
    /// A worker was forked, hardened, warmed up and said Ready, `took` after it was asked for.
    fn worker_spawned(&self, took: Duration);
    /// Asking the zygote for a worker failed before there was a worker (fork failed, the
    /// zygote was gone, the workspace could not be made).
    fn spawn_failed(&self);
    /// A worker was killed (or found dead) before it finished a job normally.
    fn worker_killed(&self, reason: KillReason);
    /// A dead zygote was replaced.
    fn zygote_restarted(&self);
    /// A worker of tier `tier` was taken for a job or session routed to tier `routed`
    /// (a fuller tier serves when the routed one has no idle worker).
    fn checked_out(&self, tier: &str, routed: &str) {
        let _ = (tier, routed);
    }
    /// A worker of tier `tier` started without the tier's warm-up: a job was waiting.
    fn worker_started_cold(&self, tier: &str) {
        let _ = tier;
    }
}

/// Ignores every event.
pub struct NoEvents;

impl PoolEvents for NoEvents {
    fn queue_wait(&self, _: Duration) {}
    fn rejected(&self, _: Rejection) {}
    fn worker_spawned(&self, _: Duration) {}
    fn spawn_failed(&self) {}
    fn worker_killed(&self, _: KillReason) {}
    fn zygote_restarted(&self) {}
}

/// Why a request was turned away (load shedding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Every slot was busy and the wait queue was full: 429.
    QueueFull,
    /// It waited `queue_timeout` for a worker: 503.
    QueueTimeout,
    /// The service is shutting down: 503.
    ShuttingDown,
}

impl Rejection {
    pub const ALL: [Rejection; 3] = [
        Rejection::QueueFull,
        Rejection::QueueTimeout,
        Rejection::ShuttingDown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue_full",
            Rejection::QueueTimeout => "queue_timeout",
            Rejection::ShuttingDown => "shutting_down",
        }
    }
}

/// Why a worker was killed or lost. A worker that reported its result and retired is not
/// counted: that is every worker's normal end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Killed at its deadline, or stopped by the CPU-time backstop.
    Timeout,
    /// Died without reporting a result (a signal, a crash, its zygote dying mid-job).
    Crashed,
    /// Sent something that breaks the job protocol; killed at once.
    ProtocolViolation,
    /// Never said Ready (it died or hung while starting).
    NotReady,
    /// Died while idle, before it took a job (it died with its zygote, usually).
    LostIdle,
    /// Its request went away mid-job (the client disconnected); killed, never reused.
    Abandoned,
    /// Died mid-job by the kernel's out-of-memory killer, most likely (see
    /// `Worker::killed_for_memory`): all workers together reached their memory bound.
    OutOfMemory,
}

impl KillReason {
    pub const ALL: [KillReason; 7] = [
        KillReason::Timeout,
        KillReason::Crashed,
        KillReason::ProtocolViolation,
        KillReason::NotReady,
        KillReason::LostIdle,
        KillReason::Abandoned,
        KillReason::OutOfMemory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Timeout => "timeout",
            KillReason::Crashed => "crashed",
            KillReason::ProtocolViolation => "protocol_violation",
            KillReason::NotReady => "not_ready",
            KillReason::LostIdle => "lost_idle",
            KillReason::Abandoned => "abandoned",
            KillReason::OutOfMemory => "out_of_memory",
        }
    }
}
