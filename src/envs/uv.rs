//! The installer: `uv` run as a [`background`] process, the configured index only, its
//! cache inside the environments directory; its failures sorted into "does not resolve"
//! and "index unreachable", each with uv's own words.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::background::{self, RunError};

/// How uv is run: which binary, which index, which cache.
#[derive(Debug, Clone)]
pub struct Uv {
    pub binary: PathBuf,
    pub cache_dir: PathBuf,
    pub index_url: String,
    pub find_links: Vec<PathBuf>,
    /// Wheels only: no package's build code runs on the host.
    pub only_binary: bool,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum UvError {
    #[error(
        "package management needs uv at {0}; install it with the README's setup (scripts/env.sh) or set packages.uv"
    )]
    Missing(PathBuf),
    /// The requirements do not resolve (a name or version that does not exist, a conflict).
    #[error("{0}")]
    Unresolvable(String),
    /// The index could not be reached.
    #[error("{0}")]
    IndexUnreachable(String),
    #[error("uv did not finish within {0:?}")]
    TimedOut(Duration),
    /// Any other failure of uv (disk full, a build that failed), with its stderr.
    #[error("{0}")]
    Failed(String),
    #[error("running {program}: {source}")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
}

/// What one install is asked to do.
#[derive(Debug, Default)]
pub struct InstallRequest<'a> {
    pub requirements: Vec<String>,
    pub constraint_files: Vec<&'a Path>,
}

impl Uv {
    /// Whether the binary is there (an admin call answers 503 when it is not).
    pub fn check(&self) -> Result<(), UvError> {
        if self.binary.is_file() {
            Ok(())
        } else {
            Err(UvError::Missing(self.binary.clone()))
        }
    }

    /// Creates a virtual environment at `dir` on `python` (an interpreter or a venv's).
    pub async fn venv(&self, dir: &Path, python: &Path) -> Result<(), UvError> {
        let mut cmd = self.command();
        cmd.args(["venv", "--quiet", "--no-config", "--python"])
            .arg(python)
            .arg(dir);
        self.run(cmd).await.map(drop)
    }

    /// Installs `request` into the environment of `python`, from the configured index only.
    pub async fn install(
        &self,
        python: &Path,
        request: &InstallRequest<'_>,
    ) -> Result<String, UvError> {
        let mut cmd = self.command();
        cmd.args(["pip", "install", "--no-config", "--python"])
            .arg(python)
            .arg("--index-url")
            .arg(&self.index_url);
        for dir in &self.find_links {
            cmd.arg("--find-links").arg(dir);
        }
        for file in &request.constraint_files {
            cmd.arg("--constraint").arg(file);
        }
        if self.only_binary {
            cmd.args(["--only-binary", ":all:"]);
        }
        // No `--compile-bytecode`: uv would compile the whole environment; the bytecode
        // step after it compiles only what the previous environment has none for.
        // `--` ends the options: no requirement can be read as one.
        cmd.arg("--").args(&request.requirements);
        self.run(cmd).await
    }

    fn command(&self) -> Command {
        let mut cmd = background::command(&self.binary);
        cmd.env("UV_CACHE_DIR", &self.cache_dir)
            .env("UV_NO_PROGRESS", "1")
            .env("NO_COLOR", "1")
            .env("UV_PYTHON_DOWNLOADS", "never");
        // Only what reaching the index needs passes through (proxies, the machine's CA
        // certificates): no `UV_*` or `PIP_*` setting of the service's environment may add
        // an index or change what is installed.
        for (key, value) in std::env::vars_os() {
            if key.to_str().is_some_and(passes_through) {
                cmd.env(key, value);
            }
        }
        cmd
    }

    async fn run(&self, cmd: Command) -> Result<String, UvError> {
        self.check()?;
        let finished = background::run(cmd, self.timeout)
            .await
            .map_err(|e| match e {
                RunError::TimedOut => UvError::TimedOut(self.timeout),
                RunError::Spawn(source) => UvError::Spawn {
                    program: self.binary.clone(),
                    source,
                },
            })?;
        if finished.success {
            return Ok(finished.stderr);
        }
        Err(classify(finished.stderr))
    }
}

/// The variables of the service's environment uv sees.
fn passes_through(key: &str) -> bool {
    matches!(
        key,
        "HOME" | "TMPDIR" | "SSL_CERT_FILE" | "SSL_CERT_DIR" | "NO_PROXY" | "no_proxy"
    ) || key.eq_ignore_ascii_case("HTTP_PROXY")
        || key.eq_ignore_ascii_case("HTTPS_PROXY")
        || key.eq_ignore_ascii_case("ALL_PROXY")
}

/// Sorts a failure by uv's message: a request that never reached the index is the
/// index's fault (502), a resolution that failed is the request's (422).
pub fn classify(stderr: String) -> UvError {
    let lower = stderr.to_lowercase();
    let unreachable = [
        "failed to fetch",
        "request failed after",
        "error sending request",
        "tcp connect error",
        "dns error",
        "connection refused",
        "operation timed out",
    ];
    if lower.contains("no solution found") || lower.contains("not found in the package registry") {
        UvError::Unresolvable(stderr)
    } else if unreachable.iter().any(|needle| lower.contains(needle)) {
        UvError::IndexUnreachable(stderr)
    } else {
        UvError::Failed(stderr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_sorted_by_what_uv_says() {
        let missing = "error: No solution found when resolving dependencies:\n  ╰─▶ Because snakecage-no-such-package-zz was not found in the package registry and you require snakecage-no-such-package-zz==1.0, we can conclude that your requirements are unsatisfiable.";
        assert!(matches!(classify(missing.into()), UvError::Unresolvable(m) if m.contains("zz")));
        let offline = "error: Request failed after 3 retries\n  Caused by: Failed to fetch: `http://127.0.0.1:9/simple/tabulate/`\n  Caused by: tcp connect error: Connection refused (os error 111)";
        assert!(matches!(
            classify(offline.into()),
            UvError::IndexUnreachable(_)
        ));
        assert!(matches!(
            classify("error: No space left on device".into()),
            UvError::Failed(_)
        ));
    }

    #[test]
    fn no_installer_setting_of_the_service_reaches_uv() {
        assert!(passes_through("SSL_CERT_FILE") && passes_through("https_proxy"));
        for key in [
            "UV_EXTRA_INDEX_URL",
            "UV_INDEX_URL",
            "PIP_FIND_LINKS",
            "PYTHONPATH",
        ] {
            assert!(!passes_through(key), "{key}");
        }
    }

    #[tokio::test]
    async fn a_missing_binary_is_named() {
        let uv = Uv {
            binary: "/nonexistent/uv".into(),
            cache_dir: std::env::temp_dir(),
            index_url: "https://pypi.org/simple".into(),
            find_links: Vec::new(),
            only_binary: true,
            timeout: Duration::from_secs(5),
        };
        let err = uv
            .venv(Path::new("/tmp/x"), Path::new("/usr/bin/python3"))
            .await;
        assert!(
            matches!(&err, Err(UvError::Missing(p)) if p == Path::new("/nonexistent/uv")),
            "{err:?}"
        );
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("needs uv at /nonexistent/uv")
        );
    }
}
