//! Preparing a zygote's interpreter to fork: `sys.path`, the runner, the preloads and the
//! package scan, the warm-ups, an immortal and frozen heap.

use std::path::Path;

use pyo3::prelude::*;
use pyo3::types::PyList;
use snakecage_worker::protocol::{PackageInfo, PreloadedModule, WarmUp, ZygoteConfig};

use super::runner::Runner;
use super::{InterpreterError, py_err};
use crate::immortal;

/// Imported in every zygote whatever its preloads (see [`prepare`]).
const ALWAYS_IMPORTED: &[&str] = &["ctypes"];

/// The source of one child warm-up job (`worker/python/warmup_*.py`).
pub(super) fn warm_up_source(warm_up: WarmUp) -> &'static str {
    match warm_up {
        WarmUp::Python => include_str!("../../python/warmup_python.py"),
        WarmUp::Numpy => include_str!("../../python/warmup_numpy.py"),
        WarmUp::Pandas => include_str!("../../python/warmup_pandas.py"),
        WarmUp::Matplotlib => include_str!("../../python/warmup_matplotlib.py"),
        WarmUp::Asyncio => include_str!("../../python/warmup_asyncio.py"),
    }
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
            py,
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
