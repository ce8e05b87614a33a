//! The closed label sets: each label value the metrics can carry is a variant here (the
//! pool's own, `KillReason` and `Rejection`, live in `pool::events`).

use serde::Serialize;

use crate::pool::run::RunVerdict;

/// What kind of execution: a one-off stateless job, or a job in a Python session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Stateless,
    Session,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Stateless, Kind::Session];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Stateless => "stateless",
            Kind::Session => "session",
        }
    }
}

/// How an execution ended: the run's verdict, or `rejected` when it was shed (429/503)
/// without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ran(RunVerdict),
    Rejected,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Ran(RunVerdict::Ok),
        Outcome::Ran(RunVerdict::Error),
        Outcome::Ran(RunVerdict::Timeout),
        Outcome::Ran(RunVerdict::MemoryLimit),
        Outcome::Ran(RunVerdict::OutputLimit),
        Outcome::Ran(RunVerdict::Killed),
        Outcome::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ran(verdict) => verdict.as_str(),
            Outcome::Rejected => "rejected",
        }
    }

    pub fn is_ok(self) -> bool {
        self == Outcome::Ran(RunVerdict::Ok)
    }
}

impl From<RunVerdict> for Outcome {
    fn from(verdict: RunVerdict) -> Self {
        Outcome::Ran(verdict)
    }
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Its client deleted it.
    Closed,
    /// It sat idle past its TTL.
    Expired,
    /// It was ended to make room for another.
    Evicted,
    /// Its worker died or had to be killed.
    Lost,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_cover_every_verdict_and_rejection_once() {
        let names: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            names,
            [
                "ok",
                "error",
                "timeout",
                "memory_limit",
                "output_limit",
                "killed",
                "rejected"
            ]
        );
        for verdict in RunVerdict::ALL {
            assert!(Outcome::ALL.contains(&Outcome::from(verdict)));
        }
    }
}
