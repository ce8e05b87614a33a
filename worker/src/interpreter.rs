//! CPython inside the zygote: isolated PyConfig start-up with `site` off, `sys.path`, the
//! runner modules (`worker/python/`), preloads, the warm-up job and
//! `gc.freeze()`; then the calls a worker makes into the runner, for one job or a session.

use std::ffi::{CString, c_char};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyModule, PyString};
use snakecage_worker::protocol::{
    ErrorInfo, Job, JobResult, MimeBundle, PackageInfo, PreloadedModule, Variable, WarmUp,
    ZygoteConfig,
};

use crate::immortal;

const TOOLS_SOURCE: &str = include_str!("../python/tools.py");

/// The runner (`worker/python/runner.py`) and the modules it imports, in load order: each
/// imports only those before it. `(name, source)`: executed as the module
/// `_snakecage_<name>`, its code objects named `snakecage/<name>.py`. Executing a code
/// module registers it in `sys.modules`, where the next ones import it.
const RUNNER_MODULES: [(&str, &str); 7] = [
    ("aio", include_str!("../python/aio.py")),
    ("display", include_str!("../python/display.py")),
    ("variables", include_str!("../python/variables.py")),
    ("report", include_str!("../python/report.py")),
    ("program", include_str!("../python/program.py")),
    ("state", include_str!("../python/state.py")),
    ("runner", include_str!("../python/runner.py")),
];

/// Imported in every zygote whatever its preloads (see [`prepare`]).
const ALWAYS_IMPORTED: &[&str] = &["ctypes"];

/// The source of one child warm-up job (`worker/python/warmup_*.py`).
fn warm_up_source(warm_up: WarmUp) -> &'static str {
    match warm_up {
        WarmUp::Python => include_str!("../python/warmup_python.py"),
        WarmUp::Numpy => include_str!("../python/warmup_numpy.py"),
        WarmUp::Pandas => include_str!("../python/warmup_pandas.py"),
        WarmUp::Matplotlib => include_str!("../python/warmup_matplotlib.py"),
        WarmUp::Asyncio => include_str!("../python/warmup_asyncio.py"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error("python home {0} is not a directory")]
    MissingHome(PathBuf),
    #[error("path {0:?} contains a NUL byte")]
    BadPath(PathBuf),
    #[error("CPython failed to initialise: {0}")]
    Init(String),
    #[error("python error while {doing}: {source}")]
    Python { doing: &'static str, source: PyErr },
    #[error("the package scan failed: {0}")]
    PackageScan(String),
}

/// Initialises CPython: UTF-8 mode (PEP 540), isolated mode (no environment variables, no
/// user site, no `sys.path[0]`), `site` off, bytecode never written, signal handlers
/// installed (SIGINT becomes KeyboardInterrupt in sessions).
pub fn initialize(config: &ZygoteConfig) -> Result<(), InterpreterError> {
    let home = python_home(config);
    if !home.is_dir() {
        return Err(InterpreterError::MissingHome(home));
    }
    pre_initialize_utf8()?;
    let home = CString::new(home.as_os_str().as_encoded_bytes())
        .map_err(|_| InterpreterError::BadPath(home.clone()))?;
    let mut raw = MaybeUninit::<ffi::PyConfig>::uninit();
    // SAFETY: PyConfig_InitIsolatedConfig fully initialises the struct it is given; the
    // pointers passed to PyConfig_SetBytesString point into that same live struct and to
    // NUL-terminated strings; the config is cleared exactly once after use.
    unsafe {
        ffi::PyConfig_InitIsolatedConfig(raw.as_mut_ptr());
        let cfg = raw.assume_init_mut();
        cfg.site_import = 0;
        cfg.write_bytecode = 0;
        cfg.install_signal_handlers = 1;
        cfg.user_site_directory = 0;
        let status = ffi::PyConfig_SetBytesString(cfg, &mut cfg.home, home.as_ptr());
        check_status(status, cfg)?;
        // Output is UTF-8 whatever locale the zygote was started in (an isolated config
        // with the C locale would make it ASCII, and `print('é')` would fail).
        let status = ffi::PyConfig_SetBytesString(cfg, &mut cfg.stdio_encoding, c"utf-8".as_ptr());
        check_status(status, cfg)?;
        let name = c"snakecage-worker";
        let status = ffi::PyConfig_SetBytesString(cfg, &mut cfg.program_name, name.as_ptr());
        check_status(status, cfg)?;
        let status = ffi::Py_InitializeFromConfig(cfg);
        check_status(status, cfg)?;
        ffi::PyConfig_Clear(cfg);
    }
    Ok(())
}

/// Pre-initialises CPython in UTF-8 mode. A worker's environment is cleared and its locale
/// is "C", which would make stdio, file names and `open()` ASCII; UTF-8 mode makes all of
/// them UTF-8 whatever the host's locale (stdio with `surrogateescape` on stdin/stdout,
/// file names with `surrogateescape`). It must be set before the interpreter is configured.
fn pre_initialize_utf8() -> Result<(), InterpreterError> {
    let mut raw = MaybeUninit::<ffi::PyPreConfig>::uninit();
    // SAFETY: PyPreConfig_InitIsolatedConfig fully initialises the struct it is given;
    // Py_PreInitialize only reads it; PyStatus is a plain value.
    let status = unsafe {
        ffi::PyPreConfig_InitIsolatedConfig(raw.as_mut_ptr());
        let pre = raw.assume_init_mut();
        pre.utf8_mode = 1;
        ffi::Py_PreInitialize(pre)
    };
    // SAFETY: see above.
    if unsafe { ffi::PyStatus_Exception(status) } == 0 {
        return Ok(());
    }
    Err(InterpreterError::Init(status_message(&status)))
}

/// The text of a failed PyStatus.
fn status_message(status: &ffi::PyStatus) -> String {
    if status.err_msg.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: a non-null err_msg is a static NUL-terminated string owned by CPython.
        unsafe { std::ffi::CStr::from_ptr(status.err_msg as *const c_char) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The prefix to run CPython from: the configured one, else the one this binary was built
/// against.
pub fn python_home(config: &ZygoteConfig) -> PathBuf {
    match &config.python_home {
        Some(home) => home.clone(),
        None => PathBuf::from(option_env!("SNAKECAGE_BUILD_PYTHON_HOME").unwrap_or("/usr")),
    }
}

/// # Safety
/// `cfg` must be a live, initialised PyConfig.
unsafe fn check_status(
    status: ffi::PyStatus,
    cfg: *mut ffi::PyConfig,
) -> Result<(), InterpreterError> {
    // SAFETY: the caller guarantees `cfg` is live; PyStatus is a plain value.
    if unsafe { ffi::PyStatus_Exception(status) } == 0 {
        return Ok(());
    }
    let msg = status_message(&status);
    // SAFETY: see above; clearing releases the strings the config owns.
    unsafe { ffi::PyConfig_Clear(cfg) };
    Err(InterpreterError::Init(msg))
}

/// The runner module (`worker/python/runner.py`) and the calls the worker makes into it.
pub struct Runner<'py> {
    module: Bound<'py, PyModule>,
    /// The sources of this tier's child warm-up jobs, in order.
    warm_up: Vec<&'static str>,
}

fn py_err(doing: &'static str) -> impl FnOnce(PyErr) -> InterpreterError {
    move |source| InterpreterError::Python { doing, source }
}

impl<'py> Runner<'py> {
    pub fn load(py: Python<'py>) -> Result<Self, InterpreterError> {
        load_tools(py).map_err(py_err("loading tools.py"))?;
        let mut module = None;
        for (name, source) in RUNNER_MODULES {
            module =
                Some(load_runner_module(py, name, source).map_err(py_err("loading the runner"))?);
        }
        Ok(Self {
            module: module.expect("the runner is the last of RUNNER_MODULES"),
            warm_up: Vec::new(),
        })
    }

    /// Which of `names` are installed, with versions, found without importing them.
    pub fn describe_packages(
        &self,
        names: &[String],
    ) -> Result<Vec<PackageInfo>, InterpreterError> {
        let described = self
            .module
            .call_method1("describe_packages", (names.to_vec(),))
            .map_err(py_err("describing the allowed packages"))?;
        let list = described
            .cast::<PyList>()
            .map_err(|e| py_err("describing the allowed packages")(e.into()))?;
        let mut out = Vec::with_capacity(list.len());
        for item in list.iter() {
            let d = item
                .cast::<PyDict>()
                .map_err(|e| py_err("describing the allowed packages")(e.into()))?;
            let field = |key: &str| d.get_item(key).ok().flatten();
            out.push(PackageInfo {
                name: field("name")
                    .and_then(|v| v.extract().ok())
                    .unwrap_or_default(),
                installed: field("installed")
                    .and_then(|v| v.extract().ok())
                    .unwrap_or(false),
                version: field("version").and_then(|v| v.extract().ok()),
            });
        }
        Ok(out)
    }

    /// Once, in the zygote: process-wide settings every child inherits, then the
    /// thorough warm-up that builds CPython's caches before the first fork.
    pub fn prepare_zygote(&self) -> Result<(), InterpreterError> {
        self.module
            .call_method0("prepare_zygote")
            .map_err(py_err("preparing the zygote"))?;
        self.module
            .call_method1("warm_up", (warm_up_source(WarmUp::Asyncio),))
            .map_err(py_err("warming up"))?;
        Ok(())
    }

    /// Whether the tier has warm-up jobs at all.
    pub fn has_warm_up(&self) -> bool {
        !self.warm_up.is_empty()
    }

    /// In each child (and once in the zygote, so lazily built state is inherited): the
    /// tier's warm-up jobs, paying their copy-on-write faults and first-use costs before
    /// the real job instead of during it.
    pub fn warm_up_child(&self) -> Result<(), InterpreterError> {
        if self.warm_up.is_empty() {
            return Ok(());
        }
        self.module
            .call_method1("warm_up_child", (self.warm_up.clone(),))
            .map_err(py_err("warming up the child"))?;
        Ok(())
    }

    pub fn prepare_child(&self) -> Result<(), InterpreterError> {
        self.module
            .call_method0("prepare_child")
            .map_err(py_err("preparing the child"))?;
        Ok(())
    }

    /// Runs one job. Output goes to fd 1/2; the returned result says how it ended.
    pub fn run(&self, job: &Job) -> Result<JobResult, InterpreterError> {
        self.run_on(&self.module, job)
    }

    /// A fresh session: one `__main__` namespace that successive jobs share.
    pub fn new_session(&self) -> Result<Session<'py>, InterpreterError> {
        let object = self
            .module
            .call_method0("Session")
            .map_err(py_err("starting a session"))?;
        Ok(Session { object })
    }

    /// Runs `job` through `target.run(job)`: the module (a fresh `__main__`) or a session.
    fn run_on(&self, target: &Bound<'py, PyAny>, job: &Job) -> Result<JobResult, InterpreterError> {
        let py = self.module.py();
        crate::tools::offer(&job.tools, job.tool_call_cap());
        let result = (|| {
            let arg = PyDict::new(py);
            arg.set_item("code", &job.code)?;
            arg.set_item("stdin", job.stdin.as_deref())?;
            arg.set_item("last_line_interactive", job.last_line_interactive)?;
            arg.set_item("entrypoint", job.entrypoint.as_deref())?;
            arg.set_item("args", &job.args)?;
            arg.set_item("max_bundle_bytes", job.max_bundle_bytes)?;
            let out = target.call_method1("run", (arg,))?;
            job_result(out.cast::<PyDict>()?)
        })();
        // A thread the job left running (in a session) must not call them after it.
        crate::tools::withdraw();
        result.map_err(py_err("running a job"))
    }

    /// The interpreter this runner lives in.
    pub fn py(&self) -> Python<'py> {
        self.module.py()
    }

    /// Runs whatever Python a pending signal calls for now, and discards the
    /// `KeyboardInterrupt` a SIGINT turns into: in a session, an interrupt aimed at a job
    /// that finished just before it arrived must not hit the next one.
    pub fn discard_pending_interrupt(&self) {
        // The only Python-level handler is SIGINT's, so the only error is that interrupt.
        let _ = self.module.py().check_signals();
    }
}

/// Executes one of [`RUNNER_MODULES`] into `sys.modules` as `_snakecage_<name>`.
fn load_runner_module<'py>(
    py: Python<'py>,
    name: &str,
    source: &str,
) -> PyResult<Bound<'py, PyModule>> {
    let code = CString::new(source).expect("the runner's sources have no NUL byte");
    let filename = CString::new(format!("snakecage/{name}.py")).expect("no NUL byte");
    let module = CString::new(format!("_snakecage_{name}")).expect("no NUL byte");
    PyModule::from_code(py, &code, &filename, &module)
}

/// `from snakecage import tools`: the package `snakecage` exists only in `sys.modules`
/// (no file on any path can stand in for it), with `tools.py` as `snakecage.tools` and its
/// native half as `_snakecage_tools`.
fn load_tools(py: Python<'_>) -> PyResult<()> {
    let modules = py.import("sys")?.getattr("modules")?;
    modules.set_item("_snakecage_tools", crate::tools::native_module(py)?)?;
    let package = PyModule::new(py, "snakecage")?;
    package.setattr("__path__", PyList::empty(py))?;
    package.setattr("__doc__", "snakecage's own modules inside the sandbox.")?;
    modules.set_item("snakecage", &package)?;
    let source = CString::new(TOOLS_SOURCE).expect("tools.py has no NUL byte");
    let tools = PyModule::from_code(py, &source, c"snakecage/tools.py", c"snakecage.tools")?;
    package.setattr("tools", tools)?;
    Ok(())
}

/// A session's namespace, living in a session worker.
pub struct Session<'py> {
    object: Bound<'py, PyAny>,
}

impl<'py> Session<'py> {
    /// Runs `job` in the session's globals. An interrupt (the supervisor's SIGINT at the
    /// deadline) that lands in the runner rather than in user code is reported like one in
    /// user code: the session lives on.
    pub fn run(&self, runner: &Runner<'py>, job: &Job) -> Result<JobResult, InterpreterError> {
        match runner.run_on(&self.object, job) {
            Err(InterpreterError::Python { source, .. }) if is_interrupt(&source) => {
                let _ = std::io::Write::write_all(&mut std::io::stderr(), b"KeyboardInterrupt\n");
                Ok(JobResult {
                    exit_code: 1,
                    memory_error: false,
                    error: Some(ErrorInfo {
                        kind: "KeyboardInterrupt".into(),
                        message: String::new(),
                    }),
                    results: Vec::new(),
                })
            }
            other => other,
        }
    }

    /// Forgets every user global; an interrupt part-way still leaves the session usable.
    pub fn reset(&self) -> Result<(), InterpreterError> {
        match self.object.call_method0("reset") {
            Ok(_) => Ok(()),
            Err(e) if is_interrupt(&e) => Ok(()),
            Err(source) => Err(InterpreterError::Python {
                doing: "resetting a session",
                source,
            }),
        }
    }

    /// The user globals, bounded by the runner, and how many there are; none when
    /// interrupted.
    pub fn variables(&self) -> Result<(Vec<Variable>, u64), InterpreterError> {
        let listed = (|| -> PyResult<(Vec<Variable>, u64)> {
            let (list, total): (Bound<'_, PyAny>, u64) =
                self.object.call_method0("variables")?.extract()?;
            let mut out = Vec::new();
            for item in list.try_iter()? {
                let item = item?;
                let d = item.cast::<PyDict>()?;
                let text = |key: &str| -> PyResult<String> {
                    Ok(match d.get_item(key)? {
                        Some(v) => user_text(&v)?,
                        None => String::new(),
                    })
                };
                let shape = match d.get_item("shape")? {
                    Some(v) if !v.is_none() => Some(v.extract::<Vec<u64>>()?),
                    _ => None,
                };
                out.push(Variable {
                    name: text("name")?,
                    kind: text("type")?,
                    repr: text("repr")?,
                    shape,
                });
            }
            Ok((out, total))
        })();
        match listed {
            Ok(v) => Ok(v),
            Err(e) if is_interrupt(&e) => Ok((Vec::new(), 0)),
            Err(source) => Err(InterpreterError::Python {
                doing: "listing session variables",
                source,
            }),
        }
    }
}

fn is_interrupt(e: &PyErr) -> bool {
    Python::attach(|py| e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py))
}

/// A `str` whose text came from user code (an exception's message, a repr, a global's
/// name). A Python `str` may hold lone surrogates (`chr(0xd800)`, a `surrogateescape`d
/// byte), which UTF-8 cannot encode and a strict extraction refuses: those are escaped
/// (`\ud800`) as CPython's stderr and displayhook print them, so such text is reported,
/// never the death of the worker (and of a session's state).
fn user_text(value: &Bound<'_, PyAny>) -> PyResult<String> {
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

fn job_result(d: &Bound<'_, PyDict>) -> PyResult<JobResult> {
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

/// Appends the configured site-packages to `sys.path`, loads the runner, imports the
/// preloads, runs the warm-up job and freezes everything into the permanent generation so
/// children never touch (and copy) those pages during collection.
pub fn prepare<'py>(
    py: Python<'py>,
    config: &ZygoteConfig,
) -> Result<Prepared<'py>, InterpreterError> {
    let sys = py.import("sys").map_err(py_err("importing sys"))?;
    let path = sys.getattr("path").map_err(py_err("reading sys.path"))?;
    let path = path
        .cast::<PyList>()
        .map_err(|e| py_err("reading sys.path")(e.into()))?;
    for dir in &config.site_packages {
        path.append(path_str(dir))
            .map_err(py_err("extending sys.path"))?;
    }
    let mut runner = Runner::load(py)?;
    // Modules whose own import trips the audit hook in a worker (ctypes opens libraries
    // at import): imported in every zygote, so that a worker whose tier did not preload
    // numpy can still import it when a job asks (numpy imports ctypes). Not reported as
    // preloads, and not importable by user code (the import guard decides that).
    for name in ALWAYS_IMPORTED {
        py.import(*name)
            .map_err(py_err("importing a module every zygote needs"))?;
    }
    // The package scan runs in a child of its own while this process imports.
    let scan = if config.describe_packages {
        Some(crate::packages::start(
            &runner,
            &config.sandbox.allowed_packages,
        )?)
    } else {
        None
    };
    let (preloaded, preload_failures) = preload(py, &config.preload);
    let packages = match scan {
        Some(scan) => scan.finish()?,
        None => Vec::new(),
    };
    let gc = py.import("gc").map_err(py_err("importing gc"))?;
    // What the imports built holds no garbage (a full collection after numpy, pandas and
    // matplotlib finds none) and is frozen at once, so that the collection after the
    // warm-ups looks only at what they made: ~1 ms instead of a pass over the whole heap
    // (25-30 ms for the fuller tiers).
    gc.call_method0("freeze")
        .map_err(py_err("freezing the imported heap"))?;
    runner.warm_up = warm_up_sources(py, &config.warm_up);
    runner.prepare_zygote()?;
    // What the warm-up jobs import or build lazily is then shared by every child.
    runner.warm_up_child()?;
    // What they left behind (a figure's reference cycles) is freed, not kept forever.
    gc.call_method0("collect")
        .map_err(py_err("collecting the warm-ups' garbage"))?;
    if config.immortal {
        // 3.12's gc.get_objects() does not list the permanent generation.
        gc.call_method0("unfreeze")
            .map_err(py_err("unfreezing the heap to make it immortal"))?;
        immortal::immortalize_heap(py).map_err(py_err("making the heap immortal"))?;
    }
    gc.call_method0("freeze")
        .map_err(py_err("freezing the heap"))?;
    Ok(Prepared {
        runner,
        preloaded,
        preload_failures,
        packages,
    })
}

/// The zygote's interpreter, ready to fork, and what it found while getting there.
pub struct Prepared<'py> {
    pub runner: Runner<'py>,
    pub preloaded: Vec<PreloadedModule>,
    pub preload_failures: Vec<String>,
    pub packages: Vec<PackageInfo>,
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The sources of the configured warm-up jobs whose library is loaded (a warm-up for a
/// module that failed to preload would only fail).
fn warm_up_sources(py: Python<'_>, warm_up: &[WarmUp]) -> Vec<&'static str> {
    let loaded = |name: &str| {
        py.import("sys")
            .and_then(|sys| sys.getattr("modules"))
            .and_then(|modules| modules.contains(name))
            .unwrap_or(false)
    };
    warm_up
        .iter()
        .filter(|w| w.needs().is_none_or(loaded))
        .map(|&w| warm_up_source(w))
        .collect()
}

fn preload(py: Python<'_>, names: &[String]) -> (Vec<PreloadedModule>, Vec<String>) {
    let mut loaded = Vec::new();
    let mut failed = Vec::new();
    for name in names {
        match py.import(name.as_str()) {
            Ok(module) => {
                let version = module
                    .getattr("__version__")
                    .ok()
                    .and_then(|v| v.extract::<String>().ok());
                loaded.push(PreloadedModule {
                    name: name.clone(),
                    version,
                });
            }
            Err(e) => failed.push(format!("{name}: {e}")),
        }
    }
    (loaded, failed)
}

pub fn python_version() -> String {
    Python::version_str()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}
