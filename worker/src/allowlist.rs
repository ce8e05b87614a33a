//! The import allowlist: `python-stdlib-allowlist` (repo root) embedded and parsed here, the
//! one place that reads it. The zygote's import guard and the supervisor (which can serve it
//! at `GET /v1/packages`) both use [`stdlib_allowlist`].

use std::sync::OnceLock;

use serde::Serialize;

/// The file's text, embedded at build time; this `include_str!` is the only one.
const STDLIB_ALLOWLIST: &str = include_str!("../../python-stdlib-allowlist");

/// One allowed standard-library module and why it is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllowedModule {
    /// A (possibly dotted) module name; allowing `xml` allows every `xml.*` submodule.
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    #[error("line {line}: {name:?} is not a dotted Python identifier")]
    BadName { line: usize, name: String },
    #[error("line {line}: {name:?} has no reason (write `name  # reason`)")]
    NoReason { line: usize, name: String },
    #[error("line {line}: {name:?} is listed twice")]
    Duplicate { line: usize, name: String },
}

/// Parses the allowlist format: `name  # reason` per line; everything from `#` on is a
/// comment; blank and comment-only lines are skipped.
pub fn parse(text: &str) -> Result<Vec<AllowedModule>, AllowlistError> {
    let mut out: Vec<AllowedModule> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let (name, reason) = match raw.split_once('#') {
            Some((name, reason)) => (name.trim(), reason.trim()),
            None => (raw.trim(), ""),
        };
        if name.is_empty() {
            continue;
        }
        if !is_dotted_identifier(name) {
            return Err(AllowlistError::BadName {
                line,
                name: name.to_owned(),
            });
        }
        if reason.is_empty() {
            return Err(AllowlistError::NoReason {
                line,
                name: name.to_owned(),
            });
        }
        if out.iter().any(|m| m.name == name) {
            return Err(AllowlistError::Duplicate {
                line,
                name: name.to_owned(),
            });
        }
        out.push(AllowedModule {
            name: name.to_owned(),
            reason: reason.to_owned(),
        });
    }
    Ok(out)
}

/// The embedded standard-library allowlist, parsed once. The file is checked by this
/// crate's tests and by the Python tests, so a parse failure here is a build defect.
pub fn stdlib_allowlist() -> &'static [AllowedModule] {
    static PARSED: OnceLock<Vec<AllowedModule>> = OnceLock::new();
    PARSED.get_or_init(|| parse(STDLIB_ALLOWLIST).expect("python-stdlib-allowlist is valid"))
}

/// True when `module` (dotted) is `allowed` or a submodule of an allowed name.
pub fn covers(allowed: &str, module: &str) -> bool {
    module == allowed
        || module
            .strip_prefix(allowed)
            .is_some_and(|rest| rest.starts_with('.'))
}

fn is_dotted_identifier(name: &str) -> bool {
    name.split('.').all(|part| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_allowlist_parses_and_leaves_out_dangerous_modules() {
        let names: Vec<&str> = stdlib_allowlist().iter().map(|m| m.name.as_str()).collect();
        assert!(names.len() > 50, "{names:?}");
        for allowed in [
            "math",
            "json",
            "os",
            "collections",
            "xml",
            "__future__",
            "asyncio",
        ] {
            assert!(names.contains(&allowed), "{allowed} should be allowed");
        }
        for denied in [
            "subprocess",
            "socket",
            "ctypes",
            "multiprocessing",
            "signal",
            "resource",
            "pty",
            "mmap",
            "importlib",
            "gc",
            "select",
            "selectors",
            "ssl",
        ] {
            assert!(!names.contains(&denied), "{denied} must not be allowed");
        }
        assert!(stdlib_allowlist().iter().all(|m| !m.reason.is_empty()));
    }

    #[test]
    fn comments_blank_lines_and_whitespace_are_skipped() {
        let parsed = parse("# header\n\n  math   # maths  \n\txml.etree # trees\n").unwrap();
        assert_eq!(
            parsed,
            vec![
                AllowedModule {
                    name: "math".into(),
                    reason: "maths".into()
                },
                AllowedModule {
                    name: "xml.etree".into(),
                    reason: "trees".into()
                },
            ]
        );
    }

    #[test]
    fn malformed_lines_are_rejected_with_their_line_number() {
        assert_eq!(
            parse("math # m\nos.path-x # bad\n"),
            Err(AllowlistError::BadName {
                line: 2,
                name: "os.path-x".into()
            })
        );
        assert_eq!(
            parse("math\n"),
            Err(AllowlistError::NoReason {
                line: 1,
                name: "math".into()
            })
        );
        assert_eq!(
            parse("math # a\nmath # b\n"),
            Err(AllowlistError::Duplicate {
                line: 2,
                name: "math".into()
            })
        );
        assert!(parse("1abc # digits first\n").is_err());
        assert!(parse("a..b # empty part\n").is_err());
    }

    #[test]
    fn an_allowed_name_covers_its_submodules_only() {
        assert!(covers("xml", "xml"));
        assert!(covers("xml", "xml.etree.ElementTree"));
        assert!(!covers("xml", "xmlrpc"));
        assert!(!covers("os", "os2"));
    }
}
