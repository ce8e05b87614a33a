//! A job's result as the runner returns it, read into the protocol's types; every text in
//! it may come from user code.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use snakecage_worker::protocol::{ErrorInfo, JobResult, MimeBundle};

/// A `str` whose text came from user code (an exception's message, a repr, a global's
/// name). A Python `str` may hold lone surrogates (`chr(0xd800)`, a `surrogateescape`d
/// byte), which UTF-8 cannot encode and a strict extraction refuses: those are escaped
/// (`\ud800`) as CPython's stderr and displayhook print them, so such text is reported,
/// never the death of the worker (and of a session's state).
pub(super) fn user_text(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let text = value.cast::<PyString>()?;
    if let Ok(s) = text.to_str() {
        return Ok(s.to_owned());
    }
    // `str.encode` itself: a subclass of `str` may override `encode`.
    let encoded = value
        .py()
        .get_type::<PyString>()
        .call_method1("encode", (text, "utf-8", "backslashreplace"))?;
    Ok(String::from_utf8_lossy(encoded.cast::<PyBytes>()?.as_bytes()).into_owned())
}

/// The run's MIME bundles; their keys and texts come from user code ([`user_text`]).
fn mime_bundles(list: &Bound<'_, PyAny>) -> PyResult<Vec<MimeBundle>> {
    let mut bundles = Vec::new();
    for bundle in list.try_iter()? {
        let bundle = bundle?;
        let mut out = MimeBundle::new();
        for (key, value) in bundle.cast::<PyDict>()?.iter() {
            out.insert(user_text(&key)?, user_text(&value)?);
        }
        bundles.push(out);
    }
    Ok(bundles)
}

pub(super) fn job_result(d: &Bound<'_, PyDict>) -> PyResult<JobResult> {
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(key)?
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(key.to_owned()))
    };
    let error = get("error")?;
    let error = if error.is_none() {
        None
    } else {
        let e = error.cast::<PyDict>()?;
        Some(ErrorInfo {
            kind: e
                .get_item("type")?
                .map(|v| user_text(&v))
                .transpose()?
                .unwrap_or_default(),
            message: e
                .get_item("message")?
                .map(|v| user_text(&v))
                .transpose()?
                .unwrap_or_default(),
        })
    };
    let results = match d.get_item("results")? {
        Some(list) if !list.is_none() => mime_bundles(&list)?,
        _ => Vec::new(),
    };
    Ok(JobResult {
        exit_code: get("exit_code")?.extract()?,
        memory_error: get("memory_error")?.extract()?,
        error,
        results,
    })
}
