//! What a change means for the next environment, decided before anything is installed:
//! the operator's requested set after the change, the requirements handed to the
//! installer (the base venv's exact pins, less what the operator overrides, plus the
//! requested specs) and the constraints that keep every other distribution at the version
//! the running environment has.

use std::collections::{BTreeMap, BTreeSet};

use super::dists::Dist;
use super::spec::Spec;

/// One change the operator asks for.
#[derive(Debug, Clone)]
pub enum Change {
    /// Install these (a name already requested is replaced), with extra constraints for
    /// this install.
    Add {
        specs: Vec<Spec>,
        constraints: Vec<Spec>,
    },
    /// Remove these requested distributions (one installed nowhere is already gone).
    Remove { names: Vec<String> },
    /// Make the requested set exactly this (a requirements.txt).
    Sync { specs: Vec<Spec> },
}

impl Change {
    /// A line for the logs and the rollover's reason.
    pub fn describe(&self) -> String {
        let join = |specs: &[Spec]| {
            specs
                .iter()
                .map(|s| s.text.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        };
        match self {
            Change::Add { specs, .. } => format!("packages add {}", join(specs)),
            Change::Remove { names } => format!("packages remove {}", names.join(" ")),
            Change::Sync { specs } => format!("packages sync ({} requirements)", specs.len()),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error(
        "{name} was not added by package management (added: {added}){base}; only added packages can be removed"
    )]
    NotAdded {
        name: String,
        added: String,
        base: &'static str,
    },
}

/// The installer's inputs for the next environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The requested set after the change, by name.
    pub requested: BTreeMap<String, String>,
    /// The distributions whose import names must be (re)read and probed.
    pub probe: Vec<String>,
    /// Names a removal gave that are installed nowhere (nothing to do for them).
    pub absent: Vec<String>,
    pub requirements: Vec<String>,
    pub constraints: Vec<String>,
}

/// Plans `change` on top of `requested`, for a base venv holding `base` and a running
/// environment holding `current`.
pub fn plan(
    change: &Change,
    requested: &BTreeMap<String, String>,
    base: &[Dist],
    current: &[Dist],
) -> Result<Plan, PlanError> {
    let mut next = requested.clone();
    // Names whose version may move in this change.
    let mut moving: BTreeSet<String> = BTreeSet::new();
    let mut probe = Vec::new();
    let mut extra_constraints = Vec::new();
    let mut absent = Vec::new();
    match change {
        Change::Add { specs, constraints } => {
            for spec in specs {
                next.insert(spec.name.clone(), spec.text.clone());
                moving.insert(spec.name.clone());
                probe.push(spec.name.clone());
            }
            extra_constraints.extend(constraints.iter().map(|c| c.text.clone()));
        }
        Change::Remove { names } => {
            for name in names {
                if next.remove(name).is_none() {
                    let in_base = base.iter().any(|d| &d.name == name);
                    if !in_base && !current.iter().any(|d| &d.name == name) {
                        // Installed nowhere: already gone, as a DELETE of it should find.
                        absent.push(name.clone());
                        continue;
                    }
                    return Err(PlanError::NotAdded {
                        name: name.clone(),
                        added: if requested.is_empty() {
                            "none".into()
                        } else {
                            requested.keys().cloned().collect::<Vec<_>>().join(", ")
                        },
                        base: if in_base {
                            ", it is part of the base environment (python.venv)"
                        } else {
                            ""
                        },
                    });
                }
                moving.insert(name.clone());
            }
        }
        Change::Sync { specs } => {
            next = specs
                .iter()
                .map(|s| (s.name.clone(), s.text.clone()))
                .collect();
            moving.extend(requested.keys().cloned());
            moving.extend(next.keys().cloned());
            probe.extend(next.keys().cloned());
        }
    }
    let mut requirements: Vec<String> = base
        .iter()
        .filter(|d| !next.contains_key(&d.name))
        .map(|d| format!("{}=={}", d.name, d.version))
        .collect();
    requirements.extend(next.values().cloned());
    // Everything not asked to move stays where the running environment has it; what is no
    // longer needed (a removed package's dependencies) simply is not installed.
    let mut constraints: Vec<String> = current
        .iter()
        .filter(|d| !moving.contains(&d.name))
        .map(|d| format!("{}=={}", d.name, d.version))
        .collect();
    constraints.extend(extra_constraints);
    Ok(Plan {
        requested: next,
        probe,
        absent,
        requirements,
        constraints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(name: &str, version: &str) -> Dist {
        Dist {
            name: name.into(),
            version: version.into(),
            dist_info: Default::default(),
        }
    }

    fn spec(text: &str) -> Spec {
        Spec::parse(text).unwrap()
    }

    #[test]
    fn an_add_keeps_the_base_pinned_and_everything_else_where_it_is() {
        let base = [dist("numpy", "2.4.6"), dist("pandas", "3.1.1")];
        let current = [
            dist("numpy", "2.4.6"),
            dist("pandas", "3.1.1"),
            dist("six", "1.17.0"),
        ];
        let requested = [("six".to_owned(), "six".to_owned())].into();
        let p = plan(
            &Change::Add {
                specs: vec![spec("tabulate==0.9.0")],
                constraints: vec![spec("wcwidth<1")],
            },
            &requested,
            &base,
            &current,
        )
        .unwrap();
        assert_eq!(
            p.requirements,
            ["numpy==2.4.6", "pandas==3.1.1", "six", "tabulate==0.9.0"]
        );
        assert_eq!(
            p.constraints,
            ["numpy==2.4.6", "pandas==3.1.1", "six==1.17.0", "wcwidth<1"]
        );
        assert_eq!(p.probe, ["tabulate"]);
        assert_eq!(p.requested.len(), 2);
    }

    #[test]
    fn an_upgrade_of_a_base_package_replaces_its_pin() {
        let base = [dist("numpy", "2.4.6")];
        let p = plan(
            &Change::Add {
                specs: vec![spec("numpy==2.4.5")],
                constraints: vec![],
            },
            &BTreeMap::new(),
            &base,
            &base,
        )
        .unwrap();
        assert_eq!(p.requirements, ["numpy==2.4.5"]);
        assert!(p.constraints.is_empty());
    }

    #[test]
    fn only_added_packages_can_be_removed() {
        let base = [dist("numpy", "2.4.6")];
        let current = [dist("numpy", "2.4.6"), dist("tabulate", "0.9.0")];
        let requested: BTreeMap<_, _> =
            [("tabulate".to_owned(), "tabulate==0.9.0".to_owned())].into();
        let p = plan(
            &Change::Remove {
                names: vec!["tabulate".into()],
            },
            &requested,
            &base,
            &current,
        )
        .unwrap();
        assert_eq!(p.requirements, ["numpy==2.4.6"]);
        assert_eq!(p.constraints, ["numpy==2.4.6"]);
        assert!(p.requested.is_empty() && p.probe.is_empty());
        let err = plan(
            &Change::Remove {
                names: vec!["numpy".into()],
            },
            &requested,
            &base,
            &current,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("part of the base environment"),
            "{err}"
        );
        assert!(err.to_string().contains("added: tabulate"), "{err}");
        // A dependency that is installed but was not asked for cannot be removed either.
        let current = [dist("numpy", "2.4.6"), dist("wcwidth", "0.2.13")];
        let err = plan(
            &Change::Remove {
                names: vec!["wcwidth".into()],
            },
            &requested,
            &base,
            &current,
        )
        .unwrap_err();
        assert!(err.to_string().contains("wcwidth was not added"), "{err}");
        // One installed nowhere is already gone: nothing to do for it.
        let p = plan(
            &Change::Remove {
                names: vec!["no-such-dist".into()],
            },
            &requested,
            &base,
            &current,
        )
        .unwrap();
        assert_eq!(p.absent, ["no-such-dist"]);
        assert_eq!(p.requested, requested);
    }

    #[test]
    fn a_sync_replaces_the_requested_set() {
        let current = [dist("tabulate", "0.9.0"), dist("six", "1.17.0")];
        let requested: BTreeMap<_, _> = [
            ("tabulate".to_owned(), "tabulate".to_owned()),
            ("six".to_owned(), "six".to_owned()),
        ]
        .into();
        let p = plan(
            &Change::Sync {
                specs: vec![spec("six==1.16.0")],
            },
            &requested,
            &[],
            &current,
        )
        .unwrap();
        assert_eq!(p.requirements, ["six==1.16.0"]);
        assert!(p.constraints.is_empty());
        assert_eq!(p.probe, ["six"]);
    }
}
