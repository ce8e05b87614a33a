//! CPython inside the zygote: isolated PyConfig start-up with `site` off, `sys.path`, the
//! runner module, preloads, the warm-up job and `gc.freeze()`.

use std::ffi::{CString, c_char};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule};
use snakecage_worker::protocol::{ErrorInfo, Job, JobResult, PreloadedModule, ZygoteConfig};

const RUNNER_SOURCE: &str = include_str!("../python/runner.py");

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
}

/// Initialises CPython: isolated mode (no environment variables, no user site, no
/// `sys.path[0]`), `site` off, bytecode never written, signal handlers installed (SIGINT
/// becomes KeyboardInterrupt in sessions).
pub fn initialize(config: &ZygoteConfig) -> Result<(), InterpreterError> {
    let home = python_home(config);
    if !home.is_dir() {
        return Err(InterpreterError::MissingHome(home));
    }
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
        let name = c"snakecage-worker";
        let status = ffi::PyConfig_SetBytesString(cfg, &mut cfg.program_name, name.as_ptr());
        check_status(status, cfg)?;
        let status = ffi::Py_InitializeFromConfig(cfg);
        check_status(status, cfg)?;
        ffi::PyConfig_Clear(cfg);
    }
    Ok(())
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
    let msg = if status.err_msg.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: a non-null err_msg is a static NUL-terminated string owned by CPython.
        unsafe { std::ffi::CStr::from_ptr(status.err_msg as *const c_char) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: see above; clearing releases the strings the config owns.
    unsafe { ffi::PyConfig_Clear(cfg) };
    Err(InterpreterError::Init(msg))
}

/// The runner module (`worker/python/runner.py`) and the calls the worker makes into it.
pub struct Runner<'py> {
    module: Bound<'py, PyModule>,
}

fn py_err(doing: &'static str) -> impl FnOnce(PyErr) -> InterpreterError {
    move |source| InterpreterError::Python { doing, source }
}

impl<'py> Runner<'py> {
    pub fn load(py: Python<'py>) -> Result<Self, InterpreterError> {
        let source = CString::new(RUNNER_SOURCE).expect("runner.py has no NUL byte");
        let module = PyModule::from_code(py, &source, c"snakecage/runner.py", c"_snakecage_runner")
            .map_err(py_err("loading runner.py"))?;
        Ok(Self { module })
    }

    pub fn warm_up(&self) -> Result<(), InterpreterError> {
        self.module
            .call_method0("warm_up")
            .map_err(py_err("warming up"))?;
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
        let py = self.module.py();
        let result = (|| {
            let arg = PyDict::new(py);
            arg.set_item("code", &job.code)?;
            arg.set_item("stdin", job.stdin.as_deref())?;
            arg.set_item("last_line_interactive", job.last_line_interactive)?;
            let out = self.module.call_method1("run", (arg,))?;
            job_result(out.cast::<PyDict>()?)
        })();
        result.map_err(py_err("running a job"))
    }
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
                .map(|v| v.extract())
                .transpose()?
                .unwrap_or_default(),
            message: e
                .get_item("message")?
                .map(|v| v.extract())
                .transpose()?
                .unwrap_or_default(),
        })
    };
    Ok(JobResult {
        exit_code: get("exit_code")?.extract()?,
        memory_error: get("memory_error")?.extract()?,
        error,
    })
}

/// Appends the configured site-packages to `sys.path`, loads the runner, imports the
/// preloads, runs the warm-up job and freezes everything into the permanent generation so
/// children never touch (and copy) those pages during collection.
pub fn prepare<'py>(
    py: Python<'py>,
    config: &ZygoteConfig,
) -> Result<(Runner<'py>, Vec<PreloadedModule>, Vec<String>), InterpreterError> {
    let sys = py.import("sys").map_err(py_err("importing sys"))?;
    let path = sys.getattr("path").map_err(py_err("reading sys.path"))?;
    let path = path
        .cast::<PyList>()
        .map_err(|e| py_err("reading sys.path")(e.into()))?;
    for dir in &config.site_packages {
        path.append(path_str(dir))
            .map_err(py_err("extending sys.path"))?;
    }
    let runner = Runner::load(py)?;
    let (loaded, failed) = preload(py, &config.preload);
    runner.warm_up()?;
    py.import("gc")
        .and_then(|gc| gc.call_method0("freeze"))
        .map_err(py_err("freezing the heap"))?;
    Ok((runner, loaded, failed))
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
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
