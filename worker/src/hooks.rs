//! The Python-level policy: an audit hook and an import guard, both in Rust so that user
//! code cannot reach their state (it lives in Rust statics, not in Python objects).
//!
//! Both are installed in the zygote before any user code can run and stay inert there (the
//! zygote's own preloading must not trip them); each worker arms them just before it says
//! Ready. They are defence in depth and a source of clear error messages: CPython itself
//! says audit hooks are no sandbox. The OS layers are the boundary (SECURITY.md).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::{PyImportError, PyPermissionError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use snakecage_worker::allowlist;
use snakecage_worker::protocol::{Layer, LayerReport, LayerState, SandboxConfig};

/// Set in a worker just before Ready; never in the zygote.
static ARMED: AtomicBool = AtomicBool::new(false);
/// The worker's workspace (its cwd when armed): the one place it may open for writing.
static WORKSPACE: OnceLock<PathBuf> = OnceLock::new();
/// Top-level names user code may import: the stdlib allowlist plus configured packages.
static ALLOWED: OnceLock<Vec<String>> = OnceLock::new();
/// `builtins.__import__` as it was before the guard replaced it.
static ORIGINAL_IMPORT: OnceLock<Py<PyAny>> = OnceLock::new();

/// Audit events denied to user code. An entry ending in `.` or `_` is a prefix; the others
/// must match the whole event name.
const DENIED_EVENTS: &[&str] = &[
    // process creation
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "subprocess.Popen",
    "_posixsubprocess.",
    "pty.spawn",
    // network
    "socket.",
    // native code and raw memory
    "ctypes.",
    "mmap.__new__",
    // other processes
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "os.pidfd_open",
    // limits, environment
    "resource.setrlimit",
    "resource.prlimit",
    "os.putenv",
    "os.unsetenv",
    // the hooks themselves, tracing and frame or object introspection
    "sys.addaudithook",
    "sys.settrace",
    "sys.setprofile",
    "sys._current_frames",
    "sys._current_exceptions",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
];

/// True when user code may not raise `event` at all.
pub fn is_denied(event: &str) -> bool {
    DENIED_EVENTS.iter().any(|denied| {
        if denied.ends_with('.') || denied.ends_with('_') {
            event.starts_with(denied)
        } else {
            event == *denied
        }
    })
}

/// True when `path` (relative ones against `cwd`) lies in `workspace`, judged lexically:
/// a symlink in the workspace pointing out is not followed here (Landlock stops the write).
pub fn is_inside(workspace: &Path, cwd: &Path, path: &Path) -> bool {
    let mut normal = PathBuf::new();
    for part in cwd.join(path).components() {
        match part {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    normal.starts_with(workspace)
}

/// Whether opening with `flags` may change the file.
fn writes(flags: i64) -> bool {
    let write_flags =
        libc::O_WRONLY | libc::O_RDWR | libc::O_APPEND | libc::O_CREAT | libc::O_TRUNC;
    flags & i64::from(write_flags) != 0
}

/// The allowlist decision for a module name, dotted or not.
pub fn import_allowed(allowed: &[String], name: &str) -> bool {
    allowed.iter().any(|a| allowlist::covers(a, name))
}

// SAFETY: the declaration matches CPython's `int PySys_AddAuditHook(Py_AuditHookFunction,
// void *)` (pyo3-ffi does not declare it).
unsafe extern "C" {
    fn PySys_AddAuditHook(
        hook: unsafe extern "C" fn(*const c_char, *mut ffi::PyObject, *mut c_void) -> c_int,
        user_data: *mut c_void,
    ) -> c_int;
}

/// Installs the audit hook and the import guard (inert until [`arm`]) and reports both.
pub fn install(py: Python<'_>, config: &SandboxConfig) -> Vec<LayerReport> {
    let mut allowed: Vec<String> = allowlist::stdlib_allowlist()
        .iter()
        .map(|m| m.name.clone())
        .collect();
    allowed.extend(config.allowed_packages.iter().cloned());
    // `snakecage.tools` lives only in sys.modules (see `interpreter::runner::load_tools`).
    allowed.push("snakecage".into());
    let _ = ALLOWED.set(allowed);

    let audit = if !config.wants(Layer::AuditHook) {
        report(
            Layer::AuditHook,
            LayerState::Off,
            "switched off by sandbox.layers_off",
        )
    } else {
        // SAFETY: the interpreter is initialised and this thread is attached; the hook is a
        // plain function that lives as long as the process.
        match unsafe { PySys_AddAuditHook(audit_hook, std::ptr::null_mut()) } {
            0 => report(
                Layer::AuditHook,
                LayerState::Active,
                &format!("{} denied events", DENIED_EVENTS.len()),
            ),
            _ => {
                let e = PyErr::take(py).map(|e| e.to_string()).unwrap_or_default();
                report(Layer::AuditHook, LayerState::Unavailable, &e)
            }
        }
    };
    let guard = if !config.wants(Layer::ImportGuard) {
        report(
            Layer::ImportGuard,
            LayerState::Off,
            "switched off by sandbox.layers_off",
        )
    } else {
        match install_import_guard(py) {
            Ok(()) => report(
                Layer::ImportGuard,
                LayerState::Active,
                &format!("{} modules allowed", ALLOWED.get().map_or(0, Vec::len)),
            ),
            Err(e) => report(Layer::ImportGuard, LayerState::Unavailable, &e.to_string()),
        }
    };
    vec![audit, guard]
}

fn report(layer: Layer, state: LayerState, detail: &str) -> LayerReport {
    LayerReport {
        layer,
        state,
        detail: detail.to_owned(),
    }
}

fn install_import_guard(py: Python<'_>) -> PyResult<()> {
    let builtins = py.import("builtins")?;
    let original = builtins.getattr("__import__")?;
    let _ = ORIGINAL_IMPORT.set(original.unbind());
    builtins.setattr("__import__", wrap_pyfunction!(guarded_import, py)?)?;
    Ok(())
}

/// Arms both hooks in this worker; the current directory is its workspace.
pub fn arm() -> std::io::Result<()> {
    let cwd = std::env::current_dir()?;
    let _ = WORKSPACE.set(cwd);
    ARMED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Replaces `builtins.__import__`: an import by user code of a module outside the allowlist
/// raises ImportError; imports made by library code (whose frame's globals are the
/// `__dict__` of a loaded module other than `__main__`) and by C code on a library's behalf
/// pass through.
#[pyfunction]
#[pyo3(name = "__import__", signature = (name, globals=None, locals=None, fromlist=None, level=0))]
fn guarded_import<'py>(
    py: Python<'py>,
    name: Bound<'py, PyAny>,
    globals: Option<Bound<'py, PyAny>>,
    locals: Option<Bound<'py, PyAny>>,
    fromlist: Option<Bound<'py, PyAny>>,
    level: i32,
) -> PyResult<Bound<'py, PyAny>> {
    if ARMED.load(Ordering::Relaxed)
        && level == 0
        && let Ok(module) = name.extract::<String>()
    {
        let allowed = ALLOWED.get().map(Vec::as_slice).unwrap_or_default();
        if !import_allowed(allowed, &module)
            && !is_c_level_import(fromlist.as_ref())
            && importer_is_user_code(py)
            && !is_workspace_module(py, &module)
        {
            let err = PyImportError::new_err(format!(
                "import of '{module}' is not allowed in this sandbox"
            ));
            let _ = err.value(py).setattr("name", &module);
            return Err(err);
        }
    }
    let original = ORIGINAL_IMPORT
        .get()
        .ok_or_else(|| PyImportError::new_err("the import machinery is not set up"))?;
    original
        .bind(py)
        .call1((name, globals, locals, fromlist, level))
}

/// Whether `module` is the user's own: a `.py` file or a package (with `__init__.py`) in
/// the workspace directory that is first on `sys.path`, not already loaded from elsewhere,
/// and not builtin or frozen (those are found before any path entry). Only then is it
/// certain that the import resolves to the user's file, which can do no more than the code
/// importing it. Namespace directories do not count: the finder would keep looking and
/// could reach a real module of the same name.
fn is_workspace_module(py: Python<'_>, module: &str) -> bool {
    let Some(workspace) = WORKSPACE.get() else {
        return false;
    };
    let top = module.split('.').next().unwrap_or(module);
    let check = || -> PyResult<bool> {
        let sys = py.import("sys")?;
        if let Ok(loaded) = sys.getattr("modules")?.get_item(top) {
            let file: Option<PathBuf> = loaded
                .getattr("__file__")
                .ok()
                .and_then(|f| f.extract().ok());
            return Ok(file.is_some_and(|f| f.starts_with(workspace)));
        }
        let builtin = sys.getattr("builtin_module_names")?.contains(top)?;
        let frozen = py
            .import("_imp")?
            .call_method1("is_frozen", (top,))?
            .is_truthy()?;
        if builtin || frozen {
            return Ok(false);
        }
        let first: PathBuf = sys.getattr("path")?.get_item(0)?.extract()?;
        if !first.is_absolute() || !first.starts_with(workspace) {
            return Ok(false);
        }
        Ok(first.join(format!("{top}.py")).is_file()
            || first.join(top).join("__init__.py").is_file())
    };
    check().unwrap_or(false)
}

/// `PyImport_Import` (what C code uses, e.g. `datetime.strptime` importing `_strptime`, or
/// `copy` importing `copyreg`) calls `__import__` with an empty *list* as fromlist; an
/// import statement passes None or a tuple.
fn is_c_level_import(fromlist: Option<&Bound<'_, PyAny>>) -> bool {
    fromlist
        .and_then(|f| f.cast_exact::<PyList>().ok())
        .is_some_and(|list| list.is_empty())
}

/// Whether the frame that is importing runs user code: its globals are not the namespace
/// of a loaded library module.
fn importer_is_user_code(py: Python<'_>) -> bool {
    // SAFETY: this thread is attached; PyEval_GetGlobals returns a borrowed reference to the
    // current frame's globals, or NULL when no Python frame is running.
    let globals = unsafe { ffi::PyEval_GetGlobals() };
    if globals.is_null() {
        return false; // called from C with no Python frame: not user code
    }
    // SAFETY: non-null and borrowed from the running frame, which outlives this call.
    let globals = unsafe { Bound::from_borrowed_ptr(py, globals) };
    let Ok(globals) = globals.cast::<PyDict>() else {
        return true;
    };
    let name = match globals.get_item("__name__") {
        Ok(Some(name)) => name,
        _ => return true,
    };
    if name.extract::<String>().is_ok_and(|n| n == "__main__") {
        return true;
    }
    let module = py
        .import("sys")
        .and_then(|sys| sys.getattr("modules"))
        .and_then(|modules| modules.get_item(&name));
    let Ok(module) = module else { return true };
    match module.getattr("__dict__") {
        Ok(dict) => !dict.is(globals),
        Err(_) => true,
    }
}

/// The audit hook. Returns 0 to let the event through, -1 with PermissionError set to stop
/// the action.
unsafe extern "C" fn audit_hook(
    event: *const c_char,
    args: *mut ffi::PyObject,
    _user_data: *mut c_void,
) -> c_int {
    if !ARMED.load(Ordering::Relaxed) {
        return 0;
    }
    // SAFETY: CPython passes a NUL-terminated event name that lives for this call.
    let event = unsafe { CStr::from_ptr(event) };
    let Ok(event) = event.to_str() else { return 0 };
    if is_denied(event) {
        // SAFETY: audit hooks run with the calling thread attached to the interpreter.
        let py = unsafe { Python::assume_attached() };
        PyPermissionError::new_err(format!("'{event}' is not allowed in this sandbox")).restore(py);
        return -1;
    }
    if event == "open" {
        // SAFETY: as above; `args` is the event's argument tuple, borrowed for this call.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: `args` is a valid, borrowed tuple.
        let args = unsafe { Bound::from_borrowed_ptr(py, args) };
        if let Some(message) = open_denial(&args) {
            PyPermissionError::new_err(message).restore(py);
            return -1;
        }
    }
    0
}

/// For the `open` event `(path, mode, flags)`: the denial message for a write outside the
/// workspace, or None.
fn open_denial(args: &Bound<'_, PyAny>) -> Option<String> {
    let args = args.cast::<PyTuple>().ok()?;
    let path = args.get_item(0).ok()?;
    let flags: i64 = args.get_item(2).ok()?.extract().ok()?;
    if !writes(flags) || path.extract::<i64>().is_ok() {
        return None; // reading, or wrapping an already open fd
    }
    let path: PathBuf = match path.extract() {
        Ok(path) => path,
        Err(_) => return None, // not a path: open() itself will reject it
    };
    if path == Path::new("/dev/null") {
        return None;
    }
    let workspace = WORKSPACE.get()?;
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    if is_inside(workspace, &cwd, &path) {
        return None;
    }
    Some(format!(
        "'open' for writing outside the workspace is not allowed in this sandbox: {:?}",
        path.display().to_string()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangerous_events_are_denied_and_ordinary_ones_pass() {
        for event in [
            "os.system",
            "os.exec",
            "os.fork",
            "os.posix_spawn",
            "subprocess.Popen",
            "socket.connect",
            "socket.getaddrinfo",
            "ctypes.dlopen",
            "ctypes.call_function",
            "mmap.__new__",
            "os.kill",
            "signal.pthread_kill",
            "resource.setrlimit",
            "sys.addaudithook",
            "sys.settrace",
            "sys.setprofile",
            "sys._current_frames",
            "gc.get_objects",
            "gc.get_referrers",
            "os.putenv",
        ] {
            assert!(is_denied(event), "{event} should be denied");
        }
        for event in [
            "open",
            "import",
            "exec",
            "compile",
            "os.listdir",
            "os.system2",
            "os.kill_all",
            "sys._getframe",
            "object.__getattr__",
            "os.remove",
        ] {
            assert!(!is_denied(event), "{event} should pass");
        }
    }

    #[test]
    fn paths_are_judged_against_the_workspace_lexically() {
        let ws = Path::new("/state/w1");
        assert!(is_inside(ws, ws, Path::new("out.csv")));
        assert!(is_inside(ws, ws, Path::new("sub/../out.csv")));
        assert!(is_inside(ws, ws, Path::new("/state/w1/a/b")));
        assert!(!is_inside(ws, ws, Path::new("../w2/x")));
        assert!(!is_inside(ws, ws, Path::new("/etc/passwd")));
        assert!(!is_inside(ws, ws, Path::new("/state/w10/x")));
        assert!(!is_inside(ws, Path::new("/tmp"), Path::new("x")));
        assert!(!is_inside(ws, ws, Path::new("../../../../etc/passwd")));
    }

    #[test]
    fn write_flags_are_recognised() {
        assert!(!writes(i64::from(libc::O_RDONLY | libc::O_CLOEXEC)));
        assert!(writes(i64::from(libc::O_WRONLY)));
        assert!(writes(i64::from(libc::O_RDWR)));
        assert!(writes(i64::from(libc::O_CREAT | libc::O_RDONLY)));
        assert!(writes(i64::from(libc::O_APPEND)));
    }

    #[test]
    fn imports_are_checked_against_the_allowlist_and_packages() {
        let allowed: Vec<String> = ["os", "xml", "numpy"].map(String::from).to_vec();
        assert!(import_allowed(&allowed, "os.path"));
        assert!(import_allowed(&allowed, "xml.etree.ElementTree"));
        assert!(import_allowed(&allowed, "numpy"));
        assert!(!import_allowed(&allowed, "subprocess"));
        assert!(!import_allowed(&allowed, "osx"));
    }
}
