//! A package change that changes nothing: what [`super::ChangeGuard::prepare`] answers
//! then, why (in the operator's words), and the comparison of the distributions a new
//! environment resolved to with the serving one's.

use std::time::Duration;

use super::dists::Dist;
use super::manifest::Manifest;
use super::plan::{Change, Plan};
use super::{Prepared, spec};

/// What [`ChangeGuard::prepare`] found.
pub enum Prepare {
    /// A new environment to roll over to.
    Built(Box<Prepared>),
    /// Nothing to roll over: the serving environment already is what the change asks for.
    Unchanged(Unchanged),
}

/// A change that leaves the environment as it is: [`ChangeGuard::keep`] records it.
#[derive(Debug)]
pub struct Unchanged {
    /// Why, for the operator: "tabulate==0.9.0 is already installed as requested".
    pub why: String,
    /// The installer's time, when it ran (the texts differed).
    pub install_time: Duration,
    /// The manifest with the new requirement texts, when they differ from the recorded ones.
    pub(super) manifest: Option<Manifest>,
}

/// Whether two environments hold the same distributions at the same versions (both
/// sorted by name, as [`super::dists::installed`] lists them).
pub(super) fn same_dists(a: &[Dist], b: &[Dist]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(a, b)| a.name == b.name && a.version == b.version)
}

/// Why a change whose requested set is the recorded one has nothing to do.
pub(super) fn already(change: &Change, plan: &Plan) -> String {
    let texts = |specs: &[spec::Spec]| {
        specs
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match change {
        Change::Add { specs, .. } => {
            format!("{} already installed as requested", texts(specs))
        }
        Change::Remove { .. } if !plan.absent.is_empty() => {
            format!(
                "{} installed nowhere: nothing to remove",
                plan.absent.join(", ")
            )
        }
        Change::Remove { .. } => "nothing to remove".to_owned(),
        Change::Sync { specs } if specs.is_empty() => {
            "the requirements name nothing, and nothing is added".to_owned()
        }
        Change::Sync { specs } => format!(
            "the {} requirements are those already installed",
            specs.len()
        ),
    }
}
