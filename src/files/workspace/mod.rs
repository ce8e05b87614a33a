//! Files in and out of a run's workspace: checking the paths a request names, staging stored
//! files at those paths before the job runs, and after it storing every new or changed file
//! (and listing every new directory).
//!
//! The scan never follows a symbolic link: links, FIFOs, sockets and devices the job made
//! are not stored, and reported as skipped. It is bounded (entries looked at, bytes stored)
//! so a job that writes 100k files cannot stall the service.
//!
//! - [`paths`]: the paths a request names, checked and normalised.
//! - [`stage`]: stored files into the workspace before the run.
//! - [`collect`]: new and changed files out of it after the run.
//! - [`footprint`]: the space a session's workspace takes, for its bound.

mod beneath;
mod collect;
mod footprint;
mod paths;
mod stage;

pub use collect::{CollectLimits, Collected, EntryKind, SkippedFile, WorkspaceFile, collect};
pub use footprint::Footprint;
pub use paths::{MAX_PATH_BYTES, NAME_MAX, RESERVED_NAME, normalize_path, shown};
pub use stage::{StageError, StageInput, Staged, snapshot, stage};
