//! requirements.txt bodies (`packages sync`), read as pip reads them: a UTF-8 byte order
//! mark is skipped, a line ending in `\` continues on the next, `#` starts a comment.
//! Only requirements are accepted: installer options (`-r`, `--index-url`, `-e`) are
//! refused, and so are hash pins (`--hash`, as `pip-compile --generate-hashes` writes
//! them), which the service does not verify: dropping them would install unverified what
//! the operator asked to verify.

use super::spec::{MAX_SPECS, Spec, SpecError, check_set};

/// One requirement a line, each checked as [`Spec::parse`] does; an empty file (or one of
/// comments) is a valid sync, which removes every added package.
pub fn parse(text: &str) -> Result<Vec<Spec>, SpecError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut specs = Vec::new();
    for (line, logical) in logical_lines(text) {
        let logical = strip_comment(&logical).trim().to_owned();
        if logical.is_empty() {
            continue;
        }
        // pip's rule: the options of a line begin at its first word that starts with `-`.
        let words: Vec<&str> = logical.split_whitespace().collect();
        let options_at = words.iter().position(|w| w.starts_with('-'));
        if let Some(at) = options_at {
            if words[at..].iter().any(|w| is_hash_option(w)) {
                let requirement = words[..at].join(" ");
                return Err(SpecError::HashPinned {
                    line,
                    requirement: if requirement.is_empty() {
                        words[at].chars().take(60).collect()
                    } else {
                        requirement
                    },
                });
            }
            return Err(SpecError::Option {
                line,
                text: logical.chars().take(60).collect(),
            });
        }
        specs.push(Spec::parse(&logical)?);
        if specs.len() > MAX_SPECS {
            return Err(SpecError::TooMany {
                what: "requirements",
                count: text.lines().count(),
            });
        }
    }
    check_set(specs.iter().map(|s| s.name.as_str()), "requirement").or_else(|e| match e {
        SpecError::Empty(_) => Ok(()),
        other => Err(other),
    })?;
    Ok(specs)
}

/// `--hash=…`, `--hash …` and `--require-hashes`: the options of a hash-pinned file.
fn is_hash_option(word: &str) -> bool {
    word == "--require-hashes" || word == "--hash" || word.starts_with("--hash=")
}

/// The file's lines with continuations joined (pip's `join_lines`): a line that ends in
/// `\` and holds no comment goes on with the next, without the `\`; each logical line
/// comes with the number of its first physical line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let continues = line.ends_with('\\') && strip_comment(line).len() == line.len();
        let (first, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        if continues {
            joined.push_str(line.trim_end_matches('\\'));
            pending = Some((first, joined));
        } else {
            joined.push_str(line);
            out.push((first, joined));
        }
    }
    out.extend(pending);
    out
}

/// A `#` starts a comment when it begins the line or follows whitespace (pip's rule).
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str) -> Vec<String> {
        parse(text).unwrap().into_iter().map(|s| s.text).collect()
    }

    #[test]
    fn requirements_files_skip_comments_and_refuse_options() {
        let text = "# pinned\ntabulate==0.9.0  # tables\n\nsix\n";
        assert_eq!(texts(text), ["tabulate==0.9.0", "six"]);
        assert_eq!(parse("# nothing\n\n").unwrap(), []);
        assert!(matches!(
            parse("six\n--extra-index-url https://x\n"),
            Err(SpecError::Option { line: 2, .. })
        ));
        assert!(matches!(
            parse("-r other.txt"),
            Err(SpecError::Option { line: 1, .. })
        ));
        // An option of one requirement is an option too.
        assert!(matches!(
            parse("six\nsimplejson --config-settings=x=1\n"),
            Err(SpecError::Option { line: 2, .. })
        ));
    }

    #[test]
    fn a_byte_order_mark_and_windows_line_ends_are_read_as_pip_reads_them() {
        assert_eq!(
            texts("\u{feff}tabulate==0.9.0\r\nsix\r\n"),
            ["tabulate==0.9.0", "six"]
        );
        assert_eq!(texts("\u{feff}"), Vec::<String>::new());
        // Only at the start: elsewhere it is not whitespace, and not a name.
        assert!(parse("six\n\u{feff}tabulate\n").is_err());
    }

    #[test]
    fn a_trailing_backslash_continues_the_line() {
        assert_eq!(
            texts("tabulate \\\n    ==0.9.0\nsix\\\n\n"),
            ["tabulate==0.9.0", "six"]
        );
        let one_line = Spec::parse("requests[socks]>=2,<3; python_version >= '3.8'").unwrap();
        assert_eq!(
            texts("requests[socks] \\\r\n  >=2,<3 \\\r\n  ; python_version >= '3.8'\r\n"),
            [one_line.text]
        );
        // A comment ends the continuation (pip's rule): the next line stands alone.
        assert_eq!(texts("six  # note \\\ntabulate\n"), ["six", "tabulate"]);
        // The last line may end in one.
        assert_eq!(texts("six \\"), ["six"]);
        // A refused continuation names the line it starts on.
        assert!(matches!(
            parse("six\ntabulate \\\n  --index-url https://x\n"),
            Err(SpecError::Option { line: 2, .. })
        ));
    }

    #[test]
    fn hash_pinned_files_are_refused_naming_the_requirement_and_what_to_do() {
        let text = "tabulate==0.9.0 \\\n    --hash=sha256:0095b12bf5966de529c0feb1fa08671671b3368eec77d7ef7ab114be2c068b3c\n";
        let err = parse(text).unwrap_err();
        assert_eq!(
            err,
            SpecError::HashPinned {
                line: 1,
                requirement: "tabulate==0.9.0".into()
            }
        );
        let message = err.to_string();
        assert!(message.contains("--generate-hashes"), "{message}");
        assert!(message.contains("not verified"), "{message}");
        for text in [
            "six\ntabulate==0.9.0 --hash sha256:00\n",
            "six\ntabulate==0.9.0 --hash=sha256:00 --hash=sha256:11\n",
        ] {
            assert!(
                matches!(parse(text), Err(SpecError::HashPinned { line: 2, .. })),
                "{text:?}"
            );
        }
        assert!(matches!(
            parse("--require-hashes\nsix\n"),
            Err(SpecError::HashPinned { line: 1, .. })
        ));
    }
}
