//! The new environment's bytecode. Workers cannot write any (the environment is read-only
//! to them): without it every import that is not preloaded would compile its modules from
//! source in every worker, 2.5-3x slower (`from scipy import stats` past the default 2 s
//! timeout). Compiling a whole environment takes many seconds of both CPUs, while the
//! distributions a change leaves alone are, file for file, those of the serving
//! environment (uv hard-links both from its cache), which compiled them already. So
//! `bytecode.py`, run by the new environment's own interpreter as a [`background`]
//! process, links the serving environment's pycs that CPython accepts for the new sources
//! and compiles the rest; with no serving environment to take from (or one whose pycs do
//! not fit: the base venv installed by pip), it compiles everything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::background::{self, RunError};

/// The compiler's source (a real `.py` file).
const BYTECODE_PY: &str = include_str!("bytecode.py");

/// What the compiler did, by source file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bytecode {
    /// Linked from the serving environment.
    pub reused: u64,
    pub compiled: u64,
    /// Not valid Python (a distribution's template or Python 2 leftover): no pyc, as with
    /// pip and uv; importing one fails either way.
    pub unparsable: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BytecodeError {
    /// The compiler failed (disk full, a directory it cannot write), with its stderr.
    #[error("compiling the new environment's bytecode failed: {0}")]
    Failed(String),
    #[error("compiling the new environment's bytecode did not finish within {0:?}")]
    TimedOut(Duration),
    #[error("running {program}: {source}")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
}

/// Gives every source of `site` (the new environment's site-packages, `python` its
/// interpreter) bytecode, linked from `previous` (the serving environment's
/// site-packages) where that has the same source compiled, compiled otherwise.
pub async fn compile(
    python: &Path,
    site: &Path,
    previous: Option<&Path>,
    timeout: Duration,
) -> Result<Bytecode, BytecodeError> {
    let mut cmd = background::command(python);
    // `-S`: no `site`, so no `.pth` file of the new environment runs here, on the host.
    cmd.args(["-I", "-S", "-c", BYTECODE_PY]).arg(site);
    if let Some(previous) = previous {
        cmd.arg(previous);
    }
    let finished = background::run(cmd, timeout).await.map_err(|e| match e {
        RunError::TimedOut => BytecodeError::TimedOut(timeout),
        RunError::Spawn(source) => BytecodeError::Spawn {
            program: python.to_path_buf(),
            source,
        },
    })?;
    if !finished.success {
        return Err(BytecodeError::Failed(finished.stderr));
    }
    serde_json::from_str(&finished.stdout).map_err(|e| {
        BytecodeError::Failed(format!(
            "its answer {:?} is not the expected summary ({e}); stderr: {}",
            finished.stdout, finished.stderr
        ))
    })
}
