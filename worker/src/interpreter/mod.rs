//! CPython inside the zygote: isolated PyConfig start-up with `site` off (`start`), the
//! runner modules (`worker/python/`), preloads, the warm-up job and `gc.freeze()`
//! (`prepare`); then the calls a worker makes into the runner, for one job or a session
//! (`runner`), and what they return, framed to be sent (`results`), a session's variable
//! listing read as hostile text (`listing`).

mod listing;
mod prepare;
mod results;
mod runner;
mod start;

use std::path::PathBuf;

use pyo3::prelude::*;

pub use prepare::{Prepared, prepare};
pub use results::result_frame;
pub use runner::Runner;
pub use start::{initialize, python_home, python_version};

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

fn py_err(doing: &'static str) -> impl FnOnce(PyErr) -> InterpreterError {
    move |source| InterpreterError::Python { doing, source }
}
