//! What an operator may ask to install or remove, checked before anything runs: PEP 508
//! requirements by name and version only (no URLs, paths or installer options: installs
//! come from the configured index), distribution names, and the bounds on how many at
//! once. (requirements.txt bodies: [`super::requirements`].)

use std::str::FromStr;

use pep508_rs::{Requirement, VersionOrUrl};

use crate::config::normalize_dist_name;

/// The most specs (or names, or requirements.txt lines) one change may carry.
pub const MAX_SPECS: usize = 100;
/// The longest one spec may be.
pub const MAX_SPEC_LEN: usize = 512;

/// A requirement the installer may be given: `name[extras] specifiers ; markers`, in its
/// canonical spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The PEP 503 name of the distribution.
    pub name: String,
    /// The canonical text handed to the installer.
    pub text: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("give at least one {0}")]
    Empty(&'static str),
    #[error("{count} {what} in one change; at most {MAX_SPECS} are accepted")]
    TooMany { what: &'static str, count: usize },
    #[error("{0:?} is longer than {MAX_SPEC_LEN} characters")]
    TooLong(String),
    #[error(
        "{spec:?} is not a valid requirement ({reason}); write it as `name`, `name==1.2.3` or `name>=1.0,<2`"
    )]
    Invalid { spec: String, reason: String },
    #[error(
        "{0:?} names a URL or a path; installs come only from the configured index (packages.index_url): give a name and version"
    )]
    NotFromIndex(String),
    #[error("{0:?} is not a distribution name (letters, digits, `-`, `_`, `.`)")]
    BadName(String),
    #[error("{0:?} appears twice in one change")]
    Duplicate(String),
    #[error(
        "requirements line {line}: {text:?} is an installer option; only requirements are accepted (the index and constraints come from the configuration)"
    )]
    Option { line: usize, text: String },
    #[error(
        "requirements line {line}: {requirement} is pinned by hash (`--hash`), and hashes are not verified here: installing it without them would skip the check the file asks for. Remove the hashes (`pip-compile` or `uv pip compile` without `--generate-hashes`) to install the pinned versions from packages.index_url; to install only files you vetted, serve them from an index or a directory you control (packages.index_url, packages.find_links)"
    )]
    HashPinned { line: usize, requirement: String },
}

impl Spec {
    pub fn parse(raw: &str) -> Result<Self, SpecError> {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err(SpecError::Empty("requirement (it is empty)"));
        }
        if trimmed.chars().count() > MAX_SPEC_LEN {
            return Err(SpecError::TooLong(trimmed.chars().take(40).collect()));
        }
        if trimmed.starts_with('-') {
            return Err(SpecError::Invalid {
                spec: trimmed.to_owned(),
                reason: "installer options are not accepted".into(),
            });
        }
        let req = Requirement::<pep508_rs::VerbatimUrl>::from_str(trimmed).map_err(|e| {
            SpecError::Invalid {
                spec: trimmed.to_owned(),
                reason: first_line(&e.to_string()),
            }
        })?;
        if matches!(req.version_or_url, Some(VersionOrUrl::Url(_))) {
            return Err(SpecError::NotFromIndex(trimmed.to_owned()));
        }
        Ok(Spec {
            name: req.name.to_string(),
            text: req.to_string(),
        })
    }

    /// Several specs for one change: not empty, bounded, each name once.
    pub fn parse_all(raw: &[String]) -> Result<Vec<Self>, SpecError> {
        let specs = raw
            .iter()
            .map(|s| Spec::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        check_set(specs.iter().map(|s| s.name.as_str()), "requirement")?;
        Ok(specs)
    }
}

/// The environment marker of a requirement text (`os_name == "nt"` of
/// `six; os_name == "nt"`), or `None` when it has none (or is not a requirement).
pub fn marker(text: &str) -> Option<String> {
    Requirement::<pep508_rs::VerbatimUrl>::from_str(text)
        .ok()?
        .marker
        .try_to_string()
}

/// Distribution names to remove, each normalised.
pub fn parse_names(raw: &[String]) -> Result<Vec<String>, SpecError> {
    let names = raw
        .iter()
        .map(|raw| {
            let name = raw.trim();
            let valid = !name.is_empty()
                && name.len() <= MAX_SPEC_LEN
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name.ends_with(|c: char| c.is_ascii_alphanumeric());
            if valid {
                Ok(normalize_dist_name(name))
            } else {
                Err(SpecError::BadName(name.chars().take(60).collect()))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_set(names.iter().map(String::as_str), "distribution name")?;
    Ok(names)
}

pub(super) fn check_set<'a>(
    names: impl Iterator<Item = &'a str>,
    what: &'static str,
) -> Result<(), SpecError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut count = 0;
    for name in names {
        count += 1;
        if !seen.insert(name) {
            return Err(SpecError::Duplicate(name.to_owned()));
        }
    }
    if count == 0 {
        return Err(SpecError::Empty(what));
    }
    if count > MAX_SPECS {
        return Err(SpecError::TooMany {
            what: "entries",
            count,
        });
    }
    Ok(())
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_by_name_and_version_are_canonical() {
        let s = Spec::parse("  Tabulate == 0.9.0 ").unwrap();
        assert_eq!(s.name, "tabulate");
        assert_eq!(s.text, "tabulate==0.9.0");
        let s = Spec::parse("Requests[socks]>=2,<3; python_version >= '3.8'").unwrap();
        assert_eq!(s.name, "requests");
        assert!(s.text.starts_with("requests[socks]"), "{}", s.text);
    }

    #[test]
    fn a_requirement_names_its_environment_marker() {
        let s = Spec::parse("six; os_name == 'nt'").unwrap();
        assert_eq!(marker(&s.text).as_deref(), Some("os_name == 'nt'"));
        assert_eq!(marker("six==1.17.0"), None);
        assert_eq!(marker("not a requirement!"), None);
    }

    #[test]
    fn urls_paths_options_and_shell_text_are_refused() {
        for bad in [
            "tabulate @ https://example.com/t.whl",
            "tabulate @ file:///tmp/x.whl",
            "--index-url=https://evil/simple",
            "-e .",
            "tabulate; rm -rf /",
            "tabulate && curl x",
            "$(reboot)",
            "`id`",
            "tab ulate",
            "tabulate==",
            "tablé",
            "📦",
            "",
            "   ",
        ] {
            assert!(Spec::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            Spec::parse("x @ https://e/x.whl"),
            Err(SpecError::NotFromIndex(_))
        ));
        assert!(matches!(
            Spec::parse(&"a".repeat(600)),
            Err(SpecError::TooLong(_))
        ));
    }

    #[test]
    fn a_change_is_bounded_and_names_each_distribution_once() {
        assert!(matches!(Spec::parse_all(&[]), Err(SpecError::Empty(_))));
        let many: Vec<String> = (0..1000).map(|i| format!("pkg{i}")).collect();
        assert!(matches!(
            Spec::parse_all(&many),
            Err(SpecError::TooMany { count: 1000, .. })
        ));
        let twice = ["tabulate".to_owned(), "Tabulate==0.9.0".to_owned()];
        assert_eq!(
            Spec::parse_all(&twice),
            Err(SpecError::Duplicate("tabulate".into()))
        );
        assert_eq!(
            parse_names(&["Foo_Bar".into(), "baz".into()]).unwrap(),
            ["foo-bar", "baz"]
        );
        assert!(parse_names(&["foo;ls".into()]).is_err());
        assert!(parse_names(&["-rf".into()]).is_err());
        assert!(parse_names(&[]).is_err());
    }
}
