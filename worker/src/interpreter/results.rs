//! A job's result as the runner returns it, read into the protocol's types (every text in
//! it may come from user code), and framed to be sent; rich outputs there is no room for
//! are dropped for a note, the rest of the result kept.

use std::io::Write;

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use snakecage_worker::frame::{self, FrameError, MAX_FRAME_LEN};
use snakecage_worker::protocol::{ErrorInfo, JobResult, MimeBundle, WorkerMessage};

use crate::reserve;

/// A `str` whose text came from user code (an exception's message, a repr, a global's
/// name). A Python `str` may hold lone surrogates (`chr(0xd800)`, a `surrogateescape`d
/// byte), which UTF-8 cannot encode and a strict extraction refuses: those are escaped
/// (`\ud800`) as CPython's stderr and displayhook print them, so such text is reported,
/// never the death of the worker (and of a session's state).
pub(super) fn user_text(value: &Bound<'_, PyAny>) -> PyResult<String> {
    with_user_text(value, str::to_owned)
}

/// `f` of the text of `value`, read as [`user_text`] reads it (no copy is made here).
fn with_user_text<R>(value: &Bound<'_, PyAny>, f: impl FnOnce(&str) -> R) -> PyResult<R> {
    let text = value.cast::<PyString>()?;
    if let Ok(s) = text.to_str() {
        return Ok(f(s));
    }
    // `str.encode` itself: a subclass of `str` may override `encode`.
    let encoded = value
        .py()
        .get_type::<PyString>()
        .call_method1("encode", (text, "utf-8", "backslashreplace"))?;
    Ok(f(&String::from_utf8_lossy(
        encoded.cast::<PyBytes>()?.as_bytes(),
    )))
}

/// The run's MIME bundles; their keys and texts come from user code ([`user_text`]).
/// They come to megabytes (50 bundles of up to `max_bundle_bytes`), at the end of a job
/// that may have used up its memory: each text is copied into a [`reserve::large`]
/// buffer, and `None` says there was no memory for one (nor for Python to read it).
fn mime_bundles(list: &Bound<'_, PyAny>) -> PyResult<Option<Vec<MimeBundle>>> {
    let mut bundles = Vec::new();
    for bundle in list.try_iter()? {
        let bundle = bundle?;
        let mut out = MimeBundle::new();
        for (key, value) in bundle.cast::<PyDict>()?.iter() {
            let (Some(key), Some(value)) = (copied_text(&key)?, copied_text(&value)?) else {
                return Ok(None);
            };
            out.insert(key, value);
        }
        bundles.push(out);
    }
    Ok(Some(bundles))
}

/// [`user_text`] in a [`reserve::large`] buffer; `None` without memory for it.
fn copied_text(value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let copied = with_user_text(value, |text| {
        let buffer = reserve::large(|| {
            let mut buffer = String::new();
            buffer.try_reserve_exact(text.len())?;
            Ok(buffer)
        });
        buffer.ok().map(|mut buffer| {
            buffer.push_str(text);
            buffer
        })
    });
    match copied {
        Err(e) if e.is_instance_of::<PyMemoryError>(value.py()) => Ok(None),
        copied => copied,
    }
}

/// Why a job's rich outputs were not reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropped {
    /// No memory was left to read them or to frame them: the job's memory limit.
    OutOfMemory,
    /// Framed, they came to `len` bytes, more than a frame may hold.
    TooLarge { len: usize },
}

/// Replaces `result`'s rich outputs, which could not be reported, by one note saying
/// why; the note goes to stderr too, where the rest of what happened is. Out of memory,
/// the job counts as having hit its memory limit.
fn drop_results(result: &mut JobResult, count: usize, why: Dropped) {
    result.results = Vec::new(); // freed before anything more is asked for
    let note = match why {
        Dropped::OutOfMemory => {
            result.memory_error = true;
            format!(
                "[results dropped: out of memory (the run's memory limit) while reporting {count} outputs]"
            )
        }
        Dropped::TooLarge { len } => format!(
            "[results dropped: {count} outputs came to {len} bytes, over the {MAX_FRAME_LEN} bytes a run's results may hold]"
        ),
    };
    let _ = writeln!(std::io::stderr(), "snakecage: {note}");
    result
        .results
        .push(MimeBundle::from([("text/plain".to_owned(), note)]));
}

/// The frame of `result`. When there is no room for it (no memory left for its buffer, or
/// more rich outputs than a frame holds), its rich outputs are dropped for a note
/// ([`drop_results`]) and the frame made again: the job's exit status, error and output
/// still reach the user, where the worker used to abort.
pub fn result_frame(result: JobResult) -> Result<Vec<u8>, FrameError> {
    let mut message = WorkerMessage::Result(result);
    let why = match frame::encode(&message) {
        Ok(frame) => return Ok(frame),
        Err(FrameError::OutOfMemory { .. }) => Dropped::OutOfMemory,
        Err(FrameError::Oversized { len, .. }) => Dropped::TooLarge { len },
        Err(e) => return Err(e),
    };
    if let WorkerMessage::Result(result) = &mut message {
        drop_results(result, result.results.len(), why);
    }
    frame::encode(&message)
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
    let mut result = JobResult {
        exit_code: get("exit_code")?.extract()?,
        memory_error: get("memory_error")?.extract()?,
        error,
        results: Vec::new(),
    };
    if let Some(list) = d.get_item("results")?.filter(|list| !list.is_none()) {
        match mime_bundles(&list)? {
            Some(results) => result.results = results,
            None => drop_results(&mut result, list.len()?, Dropped::OutOfMemory),
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result_with(results: Vec<MimeBundle>) -> JobResult {
        JobResult {
            exit_code: 0,
            memory_error: false,
            error: None,
            results,
        }
    }

    fn sent(frame: &[u8]) -> JobResult {
        match frame::decode_exact(frame, MAX_FRAME_LEN).unwrap() {
            WorkerMessage::Result(result) => result,
            other => panic!("not a result: {other:?}"),
        }
    }

    /// Rich outputs that come to more than a frame holds (50 bundles of a large
    /// `max_bundle_bytes` can) are dropped for a note; the rest of the result goes out.
    #[test]
    fn results_too_large_for_a_frame_are_dropped_for_a_note() {
        let bundle = MimeBundle::from([("text/html".to_owned(), "x".repeat(MAX_FRAME_LEN / 2))]);
        let mut result = result_with(vec![bundle.clone(), bundle.clone(), bundle]);
        result.exit_code = 3;
        let result = sent(&result_frame(result).unwrap());
        assert_eq!((result.exit_code, result.memory_error), (3, false));
        assert_eq!(result.results.len(), 1);
        let note = &result.results[0]["text/plain"];
        assert!(
            note.starts_with("[results dropped: 3 outputs came to ")
                && note.ends_with(&format!(
                    " bytes, over the {MAX_FRAME_LEN} bytes a run's results may hold]"
                )),
            "{note}"
        );

        let small = result_with(vec![MimeBundle::from([(
            "text/plain".to_owned(),
            "42".to_owned(),
        )])]);
        assert_eq!(sent(&result_frame(small.clone()).unwrap()), small);
    }
}
