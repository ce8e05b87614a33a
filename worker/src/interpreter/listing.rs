//! Reads a session's variable listing as `worker/python/variables.py` gives it, as hostile
//! text: the job ran in this process and may have replaced the runner's functions, so the
//! listing's bounds are enforced again here and nothing it holds can fail the reading.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use snakecage_worker::protocol::Variable;

use super::results::user_text;

/// Entries listed at most (`MAX_VARIABLES` in `variables.py`).
const MAX_ENTRIES: usize = 500;
/// The longest name, type or repr (`NAME_CHARS`, `TYPE_CHARS`, `REPR_CHARS`).
const FIELD_CHARS: usize = 100;
/// Characters of names, types and reprs in all (`LISTING_CHARS`).
const LISTING_CHARS: usize = 50_000;

/// The entries of `list`, bounded; an entry that is not a dict of texts is listed as unknown.
pub(super) fn read(list: &Bound<'_, PyAny>) -> PyResult<Vec<Variable>> {
    let mut out = Vec::new();
    let mut room = LISTING_CHARS;
    for item in list.try_iter()?.take(MAX_ENTRIES) {
        let entry = item
            .and_then(|item| entry(&item))
            .unwrap_or_else(|_| unknown());
        let size =
            entry.name.chars().count() + entry.kind.chars().count() + entry.repr.chars().count();
        if size > room {
            break;
        }
        room -= size;
        out.push(entry);
    }
    Ok(out)
}

/// What a listing that failed as a whole gives: one entry that says so, and why.
pub(super) fn failed(e: &PyErr) -> Variable {
    let why = Python::attach(|py| {
        // `PyType_GetName`: the name the class was given, never a metaclass's `__name__`.
        e.get_type(py)
            .name()
            .and_then(|name| user_text(name.as_any()))
            .unwrap_or_else(|_| "an exception".to_owned())
    });
    Variable {
        name: "?".to_owned(),
        kind: "?".to_owned(),
        repr: cut(&format!("<variables not listed: {why}>")),
        shape: None,
    }
}

fn entry(item: &Bound<'_, PyAny>) -> PyResult<Variable> {
    let d = item.cast::<PyDict>()?;
    let text = |key: &str| -> PyResult<String> {
        Ok(match d.get_item(key)? {
            Some(v) => cut(&user_text(&v)?),
            None => String::new(),
        })
    };
    let shape = match d.get_item("shape")? {
        Some(v) if !v.is_none() => Some(v.extract::<Vec<u64>>()?),
        _ => None,
    };
    Ok(Variable {
        name: text("name")?,
        kind: text("type")?,
        repr: text("repr")?,
        shape: shape.map(|s| s.into_iter().take(32).collect()),
    })
}

fn unknown() -> Variable {
    Variable {
        name: "?".to_owned(),
        kind: "?".to_owned(),
        repr: "<not described: the listing gave an unreadable entry>".to_owned(),
        shape: None,
    }
}

/// `text` cut to [`FIELD_CHARS`], ending in `…` when cut, as the runner cuts.
fn cut(text: &str) -> String {
    match text.char_indices().nth(FIELD_CHARS - 1) {
        Some((end, _)) if text.chars().count() > FIELD_CHARS => format!("{}…", &text[..end]),
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn a_long_text_is_cut_to_its_bound_in_characters() {
        let long = "é".repeat(250);
        let cut_text = cut(&long);
        assert_eq!(cut_text.chars().count(), 100);
        assert!(cut_text.ends_with("é…"));
        assert_eq!(cut("short"), "short");
        assert_eq!(cut(&"x".repeat(100)), "x".repeat(100));
    }
}
