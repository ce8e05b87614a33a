//! The runner (`worker/python/runner.py`) and the modules it imports, loaded into the
//! zygote; the calls a worker makes into it for one job or a session.

use std::ffi::CString;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule};
use snakecage_worker::protocol::{ErrorInfo, Job, JobResult, Variable, WarmUp};

use super::listing;
use super::prepare::warm_up_source;
use super::results::job_result;
use super::{InterpreterError, py_err};

const TOOLS_SOURCE: &str = include_str!("../../python/tools.py");

/// The runner (`worker/python/runner.py`) and the modules it imports, in load order: each
/// imports only those before it. `(name, source)`: executed as the module
/// `_snakecage_<name>`, its code objects named `snakecage/<name>.py`. Executing a code
/// module registers it in `sys.modules`, where the next ones import it.
const RUNNER_MODULES: [(&str, &str); 9] = [
    ("alarm", include_str!("../../python/alarm.py")),
    ("aio", include_str!("../../python/aio.py")),
    ("display", include_str!("../../python/display.py")),
    ("variables", include_str!("../../python/variables.py")),
    ("report", include_str!("../../python/report.py")),
    ("program", include_str!("../../python/program.py")),
    ("files", include_str!("../../python/files.py")),
    ("state", include_str!("../../python/state.py")),
    ("runner", include_str!("../../python/runner.py")),
];

/// The runner module (`worker/python/runner.py`) and the calls the worker makes into it.
pub struct Runner<'py> {
    module: Bound<'py, PyModule>,
    /// The sources of this tier's child warm-up jobs, in order.
    pub(super) warm_up: Vec<&'static str>,
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
            arg.set_item("timeout_ms", job.timeout_ms)?;
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

    /// The user globals, bounded, and how many there are; none when interrupted.
    ///
    /// It never fails, so a listing never costs a session its worker: what the runner
    /// answers is read as hostile (a job can replace the runner's functions in its own
    /// process), an entry that cannot be read is listed as unknown, and a listing that
    /// fails as a whole is one entry saying so. The runner's bounds are enforced again here
    /// ([`listing`]).
    pub fn variables(&self) -> (Vec<Variable>, u64) {
        let listed = self
            .object
            .call_method0("variables")
            .and_then(|answer| answer.extract::<(Bound<'_, PyAny>, u64)>())
            .and_then(|(list, total)| Ok((listing::read(&list)?, total)));
        match listed {
            Ok(listed) => listed,
            Err(e) if is_interrupt(&e) => (Vec::new(), 0),
            Err(e) => (vec![listing::failed(&e)], 0),
        }
    }
}

fn is_interrupt(e: &PyErr) -> bool {
    Python::attach(|py| e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py))
}
