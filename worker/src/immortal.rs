//! Making the zygote's heap immortal (PEP 683) before it forks: every object the
//! collector tracks, and every object those reach, gets CPython 3.12's immortal reference
//! count, so the `Py_INCREF`/`Py_DECREF` a worker does on them write nothing and the pages
//! holding them stay shared with the zygote instead of being copied on first use.
//!
//! An immortal object is never freed. That is what the zygote's heap already was: it is
//! frozen (`gc.freeze()`) and every worker exits after its job or session. A worker may
//! still rebind, mutate or delete these objects; only their memory is never reclaimed,
//! and objects it creates itself stay mortal.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// CPython 3.12's immortal reference count on 64-bit builds (`_Py_IMMORTAL_REFCNT`,
/// `Include/object.h`: `UINT_MAX`). `Py_INCREF` adds to the low 32 bits and stops when
/// they would wrap; `_Py_IsImmortal`, which `Py_DECREF` checks first, is "the low 32 bits,
/// read as a signed integer, are negative". A value of all ones in the low half is both.
const IMMORTAL_REFCNT: ffi::Py_ssize_t = u32::MAX as ffi::Py_ssize_t;

/// What [`immortalize_heap`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Immortalized {
    /// Objects whose reference count was set (already immortal ones included).
    pub objects: usize,
}

/// Sets the immortal reference count on every object `gc.get_objects()` returns and on
/// everything reachable from them through `tp_traverse` (strings, ints, bytes and other
/// objects the collector does not track are found that way). Must run before
/// `gc.freeze()`: in 3.12 `gc.get_objects()` does not list the permanent generation.
pub fn immortalize_heap(py: Python<'_>) -> PyResult<Immortalized> {
    let objects = py.import("gc")?.call_method0("get_objects")?;
    let objects = objects.cast::<PyList>()?;
    let mut seen: HashSet<usize> = HashSet::with_capacity(objects.len() * 2);
    // The list itself is a temporary: it must stay mortal so it is freed below.
    seen.insert(objects.as_ptr() as usize);
    let mut stack: Vec<*mut ffi::PyObject> = objects.iter().map(|o| o.as_ptr()).collect();
    let mut count = 0;
    while let Some(op) = stack.pop() {
        if !seen.insert(op as usize) {
            continue;
        }
        // SAFETY: `op` is a live object: it was listed by the collector or reached from
        // one, and everything listed is kept alive by `objects` (held here) while the GIL
        // is held (`py`) and no Python code runs in this loop (only C getters of code
        // objects' fields), so nothing is freed or moved under it.
        unsafe { immortalize(op, &mut stack) };
        // SAFETY: as above.
        if unsafe { ffi::PyCode_Check(op) } != 0 {
            // SAFETY: as above; the borrowed pointer is turned into an owned reference
            // for the duration of the reads only.
            let code = unsafe { Bound::from_borrowed_ptr(py, op) };
            push_code_fields(&code, &mut stack);
        }
        count += 1;
    }
    Ok(Immortalized { objects: count })
}

/// A code object is not tracked by the collector in 3.12 and has no `tp_traverse`, yet
/// its constants, names and tables are what a worker's `LOAD_CONST` and tracebacks touch
/// (constants are reference counted on every load). These attributes are plain members:
/// reading one returns the stored object, it builds nothing.
fn push_code_fields(code: &Bound<'_, PyAny>, stack: &mut Vec<*mut ffi::PyObject>) {
    const FIELDS: [&str; 7] = [
        "co_consts",
        "co_names",
        "co_filename",
        "co_name",
        "co_qualname",
        "co_linetable",
        "co_exceptiontable",
    ];
    for field in FIELDS {
        // The reference taken by the read is dropped at once: the count is back where it
        // was when the object is reached from the stack.
        if let Ok(value) = code.getattr(field) {
            stack.push(value.as_ptr());
        }
    }
}

/// Sets `op`'s reference count to the immortal value and pushes its referents.
///
/// # Safety
/// `op` must point to a live object and the GIL must be held.
unsafe fn immortalize(op: *mut ffi::PyObject, stack: &mut Vec<*mut ffi::PyObject>) {
    // SAFETY: the caller guarantees `op` is live; writing the whole reference count field
    // is what `Py_SET_REFCNT` does, without its early return for objects already immortal
    // (for which this writes the same value).
    unsafe { (*op).ob_refcnt.ob_refcnt = IMMORTAL_REFCNT };
    // What `gc.get_referents` does: only objects with the GC flag have a meaningful
    // `tp_traverse`.
    // SAFETY: `op` is live, so its type is too.
    let traverse = unsafe {
        if ffi::PyObject_IS_GC(op) == 0 {
            return;
        }
        (*ffi::Py_TYPE(op)).tp_traverse
    };
    if let Some(traverse) = traverse {
        // SAFETY: `visit` matches `visitproc` and only pushes the pointers it is given to
        // the `Vec` passed as its argument, which outlives the call.
        unsafe { traverse(op, visit, (stack as *mut Vec<*mut ffi::PyObject>).cast()) };
    }
}

extern "C" fn visit(object: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
    if !object.is_null() {
        // SAFETY: `arg` is the `&mut Vec` `immortalize` passed to `tp_traverse`, alive and
        // not otherwise borrowed during the call.
        let stack = unsafe { &mut *arg.cast::<Vec<*mut ffi::PyObject>>() };
        stack.push(object);
    }
    0
}
