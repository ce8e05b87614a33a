//! Making the zygote's heap immortal (PEP 683) before it forks: every object the
//! collector tracks, and every object those reach, gets CPython 3.12's immortal reference
//! count, so the `Py_INCREF`/`Py_DECREF` a worker does on them write nothing and the pages
//! holding them stay shared with the zygote instead of being copied on first use.
//!
//! An immortal object is never freed. That is what the zygote's heap already was: it is
//! frozen (`gc.freeze()`) and every worker exits after its job or session. A worker may
//! still rebind, mutate or delete these objects; only their memory is never reclaimed,
//! and objects it creates itself stay mortal.

use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

/// CPython 3.12's immortal reference count on 64-bit builds (`_Py_IMMORTAL_REFCNT`,
/// `Include/object.h`: `UINT_MAX`). `Py_INCREF` adds to the low 32 bits and stops when
/// they would wrap; `_Py_IsImmortal`, which `Py_DECREF` checks first, is "the low 32 bits,
/// read as a signed integer, are negative". A value of all ones in the low half is both.
const IMMORTAL_REFCNT: ffi::Py_ssize_t = u32::MAX as ffi::Py_ssize_t;

/// What [`immortalize_heap`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Immortalized {
    /// Objects whose reference count was set (those immortal already are not counted).
    pub objects: usize,
}

/// Sets the immortal reference count on every object `gc.get_objects()` returns and on
/// everything reachable from them through `tp_traverse` (strings, ints, bytes and other
/// objects the collector does not track are found that way). Must run before
/// `gc.freeze()`: in 3.12 `gc.get_objects()` does not list the permanent generation.
///
/// The reference count is the walk's visited mark: an object already immortal when it
/// is reached was set by this walk (its referents are on the stack or done) or was
/// immortal before it began. In 3.12 the latter are the interpreter's static objects
/// (builtin types, small ints, singletons, deep-frozen code and its constants) and
/// interned strings: the collector does not track them, and what they refer to is
/// immortal or tracked (a builtin type's `__dict__`), so it is reached from the list.
pub fn immortalize_heap(py: Python<'_>) -> PyResult<Immortalized> {
    let objects = py.import("gc")?.call_method0("get_objects")?;
    let objects = objects.cast::<PyList>()?;
    let fields = code_fields(py);
    let mut stack: Vec<*mut ffi::PyObject> = objects.iter().map(|o| o.as_ptr()).collect();
    let list = objects.as_ptr();
    let mut count = 0;
    while let Some(op) = stack.pop() {
        // The list itself is a temporary: it must stay mortal so it is freed below.
        if op == list {
            continue;
        }
        // SAFETY: `op` is a live object: it was listed by the collector or reached from
        // one, and everything listed is kept alive by `objects` (held here) while the GIL
        // is held (`py`) and no Python code runs in this loop (only C getters of code
        // objects' fields), so nothing is freed or moved under it.
        if unsafe { is_immortal(op) } {
            continue;
        }
        // SAFETY: as above.
        unsafe { immortalize(op, &mut stack) };
        // SAFETY: as above.
        if unsafe { ffi::PyCode_Check(op) } != 0 {
            // SAFETY: as above; the borrowed pointer is turned into an owned reference
            // for the duration of the reads only.
            let code = unsafe { Bound::from_borrowed_ptr(py, op) };
            push_code_fields(&code, &fields, &mut stack);
        }
        count += 1;
    }
    Ok(Immortalized { objects: count })
}

/// `_Py_IsImmortal` of 3.12 on 64-bit builds: the low 32 bits, read as a signed integer,
/// are negative.
///
/// # Safety
/// `op` must point to a live object and the GIL must be held.
unsafe fn is_immortal(op: *mut ffi::PyObject) -> bool {
    // SAFETY: the caller guarantees `op` is live.
    let refcnt = unsafe { (*op).ob_refcnt.ob_refcnt };
    (refcnt as u32 as i32) < 0
}

/// The names of a code object's fields that hold objects, interned once for the walk.
fn code_fields(py: Python<'_>) -> [Bound<'_, PyString>; 7] {
    [
        "co_consts",
        "co_names",
        "co_filename",
        "co_name",
        "co_qualname",
        "co_linetable",
        "co_exceptiontable",
    ]
    .map(|name| PyString::intern(py, name))
}

/// A code object is not tracked by the collector in 3.12 and has no `tp_traverse`, yet
/// its constants, names and tables are what a worker's `LOAD_CONST` and tracebacks touch
/// (constants are reference counted on every load). These attributes are plain members:
/// reading one returns the stored object, it builds nothing.
fn push_code_fields(
    code: &Bound<'_, PyAny>,
    fields: &[Bound<'_, PyString>],
    stack: &mut Vec<*mut ffi::PyObject>,
) {
    for field in fields {
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

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use pyo3::types::PyDict;
    use snakecage_worker::protocol::ZygoteConfig;

    use super::*;

    /// Counts the objects reachable from the collector's list (and from the fields of code
    /// objects the walk reads) and how many of them are mortal. `seen` is made after the
    /// list is taken, so neither it nor the ids it holds are counted.
    const COUNT: &CStr = c"import gc, sys, types
def count():
    stack = gc.get_objects()
    seen = set()
    total = mortal = 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += 1
        if sys.getrefcount(o) < 2**31:
            mortal += 1
        stack.extend(gc.get_referents(o))
        if isinstance(o, types.CodeType):
            stack.extend((o.co_consts, o.co_names, o.co_filename, o.co_name, o.co_qualname,
                          o.co_linetable, o.co_exceptiontable))
    return total, mortal
";

    /// A heap holding what the walk must reach: tracked containers and, only inside them,
    /// untracked strings, floats, big ints and bytes; code whose constants nothing else
    /// holds.
    const HEAP: &CStr = c"import json, decimal
DATA = {'clé': [1.5, 'été' * 3, (2**70, b'\\xff\\x00')]}
def f():
    return ('a constant only this code holds', 3.25, 10**30)
";

    fn count(py: Python<'_>, globals: &Bound<'_, PyDict>) -> (usize, usize) {
        py.eval(c"count()", Some(globals), None)
            .unwrap()
            .extract()
            .unwrap()
    }

    fn refcount(py: Python<'_>, globals: &Bound<'_, PyDict>, expr: &CStr) -> u64 {
        let expr = format!("sys.getrefcount({})", expr.to_str().unwrap());
        let expr = std::ffi::CString::new(expr).unwrap();
        py.eval(&expr, Some(globals), None)
            .unwrap()
            .extract()
            .unwrap()
    }

    #[test]
    fn everything_the_heap_reaches_becomes_immortal_each_object_once() {
        let config: ZygoteConfig = serde_json::from_value(serde_json::json!({
            "python_home": null,
            "site_packages": [],
            "preload": [],
            "mpl_config_dir": "/nonexistent",
            "limits": {
                "memory_limit_bytes": 0,
                "cpu_seconds": 0,
                "max_file_bytes": 0,
                "max_open_files": 0,
                "max_processes": 0,
            },
        }))
        .unwrap();
        crate::interpreter::initialize(&config).unwrap();
        Python::attach(|py| {
            let globals = PyDict::new(py);
            py.run(COUNT, Some(&globals), None).unwrap();
            py.run(HEAP, Some(&globals), None).unwrap();
            let (total, mortal) = count(py, &globals);
            assert!(total > 10_000 && mortal > 5_000, "{total} {mortal}");

            let done = immortalize_heap(py).unwrap();
            // Each mortal object is set once and counted once (the counter's own few
            // objects aside); the objects immortal already are not counted.
            assert!(done.objects.abs_diff(mortal) < 100, "{done:?} {mortal}");
            let (total_after, mortal_after) = count(py, &globals);
            assert!(total_after.abs_diff(total) < 100, "{total_after} {total}");
            assert!(
                mortal_after < 50,
                "{mortal_after} of {total_after} still mortal"
            );
            for expr in [
                c"DATA",
                c"DATA['clé'][0]",
                c"DATA['clé'][1]",
                c"DATA['clé'][2][0]",
                c"DATA['clé'][2][1]",
                c"f()[0]",
                c"f()[2]",
                c"json.dumps",
            ] {
                assert_eq!(refcount(py, &globals, expr), 4_294_967_295, "{expr:?}");
            }
            // Nothing is left for a second walk but what was made since.
            let again = immortalize_heap(py).unwrap();
            assert!(again.objects < 50, "{again:?}");
        });
    }
}
