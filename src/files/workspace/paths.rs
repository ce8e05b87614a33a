//! The workspace paths a request names (`files[].path`, `entrypoint`): checked against
//! escapes and the kernel's limits, and normalised, before anything touches the disk.

use std::path::{Component, Path};

/// The name the runner compiles `code` under; a staged file may not take it.
pub const RESERVED_NAME: &str = "__main__.py";

/// The longest file name (one path component) the kernel accepts, in bytes (NAME_MAX).
pub const NAME_MAX: usize = 255;

/// The longest relative path accepted, in bytes: PATH_MAX (4096, with its NUL) less room
/// for the workspace's own absolute path, which the service puts in front of it.
pub const MAX_PATH_BYTES: usize = 3840;

/// Checks a workspace path from a request and returns it normalised (`./a//b` ⇒ `a/b`).
/// The message says what is wrong with it; the Onyx service's wording comes first where
/// it has one (clients match on it).
pub fn normalize_path(raw: &str) -> Result<String, String> {
    if raw.contains('\0') {
        return Err(format!("File path {} contains a NUL byte.", shown(raw)));
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(format!(
            "File path {} is {} bytes long; the limit is {MAX_PATH_BYTES} bytes (PATH_MAX).",
            shown(raw),
            raw.len()
        ));
    }
    let mut parts = Vec::new();
    for component in Path::new(raw).components() {
        match component {
            Component::RootDir | Component::Prefix(_) => {
                return Err("File paths must be relative.".to_owned());
            }
            Component::ParentDir => {
                return Err(format!(
                    "File paths must not contain '..'. {} would leave the workspace.",
                    shown(raw)
                ));
            }
            Component::CurDir => {}
            Component::Normal(part) => {
                let part = part.to_string_lossy().into_owned();
                if part.len() > NAME_MAX {
                    return Err(format!(
                        "File path {} has a component of {} bytes; the limit is {NAME_MAX} bytes per name (NAME_MAX).",
                        shown(raw),
                        part.len()
                    ));
                }
                parts.push(part);
            }
        }
    }
    if parts.is_empty() {
        return Err(format!("File path {} names no file.", shown(raw)));
    }
    let path = parts.join("/");
    if path == RESERVED_NAME {
        return Err(format!(
            "File path {RESERVED_NAME:?} is reserved for the submitted code; choose another name."
        ));
    }
    Ok(path)
}

/// `raw` quoted for a message, cut to its first 64 characters (a 10,000-byte path is not
/// echoed back whole).
pub fn shown(raw: &str) -> String {
    const MAX_CHARS: usize = 64;
    match raw.char_indices().nth(MAX_CHARS) {
        None => format!("{raw:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &raw[..cut], raw.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_and_escapes_refused() {
        assert_eq!(normalize_path("data/in.csv").unwrap(), "data/in.csv");
        assert_eq!(normalize_path("./data//in.csv").unwrap(), "data/in.csv");
        assert_eq!(
            normalize_path("/etc/passwd").unwrap_err(),
            "File paths must be relative."
        );
        for escape in ["a/../../x", "..", "../x"] {
            let err = normalize_path(escape).unwrap_err();
            assert!(
                err.starts_with("File paths must not contain '..'."),
                "{err}"
            );
        }
        assert!(
            normalize_path("__main__.py")
                .unwrap_err()
                .contains("reserved")
        );
        assert_eq!(
            normalize_path("lib/__main__.py").unwrap(),
            "lib/__main__.py"
        );
        assert!(normalize_path("").is_err());
        assert!(normalize_path(".").is_err());
        assert!(normalize_path("a\0b").is_err());
    }

    #[test]
    fn paths_beyond_the_kernel_limits_are_refused_naming_the_limit() {
        let long = "a".repeat(10_000);
        let err = normalize_path(&long).unwrap_err();
        assert!(
            err.contains("PATH_MAX") && err.contains("10000 bytes"),
            "{err}"
        );
        assert!(err.len() < 300, "the path is not echoed whole: {err}");
        let name = format!("dir/{}", "é".repeat(128));
        let err = normalize_path(&name).unwrap_err();
        assert!(
            err.contains("NAME_MAX") && err.contains("256 bytes"),
            "{err}"
        );
        let fits = format!("{}/x", "b".repeat(NAME_MAX));
        assert_eq!(normalize_path(&fits).unwrap(), fits);
        let deep = vec!["d"; MAX_PATH_BYTES / 2].join("/");
        assert_eq!(normalize_path(&deep).unwrap(), deep);
    }
}
