//! The `snakecage` binary: configuration, logging, bind, serve.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use nix::sys::signal::{SigHandler, Signal};
use snakecage::config::{Config, LogFormat, Overrides};
use snakecage::pool::uids;
use snakecage::{hangup, server, shutdown};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Runs untrusted Python in pre-forked, sandboxed CPython workers behind an HTTP API.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// TOML configuration file.
    #[arg(long, env = "SNAKECAGE_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage API keys (only their SHA-256 is stored).
    #[command(subcommand)]
    Keys(snakecage::cli::keys::KeysCommand),
    /// Manage the Python packages of a running service (admin API key).
    Packages(snakecage::cli::packages::PackagesArgs),
}

/// How long a stopped service waits for the work left on the runtime's blocking threads
/// before it exits: chiefly [`uids::release_when_gone`], which holds a worker's uid until
/// no process runs under it. A worker stuck in the kernel (uninterruptible sleep on a hung
/// file system) or a process of the host's under a worker's id would otherwise keep the
/// stopped service from ever exiting.
const BACKGROUND_PATIENCE: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    // SIGHUP ends a process by default: ignored from the first instruction we run until
    // `hangup::reload_signal` installs the reload handler (a handler, unlike SIG_IGN, is
    // reset at exec, so the zygotes started after it do not inherit this).
    // SAFETY: SIG_IGN installs no handler code; nothing else touches SIGHUP yet.
    if let Err(e) = unsafe { nix::sys::signal::signal(Signal::SIGHUP, SigHandler::SigIgn) } {
        eprintln!("snakecage: cannot ignore SIGHUP during start-up: {e}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("snakecage: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run());
    let ending = Instant::now();
    runtime.shutdown_timeout(BACKGROUND_PATIENCE);
    if ending.elapsed() >= BACKGROUND_PATIENCE {
        gave_up_waiting();
    }
    code
}

/// Says what a stop that waited [`BACKGROUND_PATIENCE`] in vain leaves behind.
fn gave_up_waiting() {
    let left = uids::still_awaited();
    if left.is_empty() {
        tracing::warn!(
            patience = ?BACKGROUND_PATIENCE,
            "exiting with background work still running"
        );
        return;
    }
    tracing::warn!(
        patience = ?BACKGROUND_PATIENCE,
        "exiting without waiting any longer for worker uids to be free: processes still \
         run under them: {}; until they are gone, an instance with sandbox.uid unset passes \
         over their block, and one with it set waits for them and then refuses to start",
        uids::Occupant::describe_all(&left)
    );
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref(), &cli.overrides) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("snakecage: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Packages(args)) = cli.command {
        return match snakecage::cli::packages::run(args, config.listen).await {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("snakecage: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Keys(command)) = cli.command {
        return match snakecage::cli::keys::run(command, &config) {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("snakecage: {e}");
                ExitCode::FAILURE
            }
        };
    }
    init_logging(&config);
    // Before anything that can take time: a SIGTERM from here on stops the service in order.
    let shutdown = shutdown::shutdown_signal();
    // Likewise SIGHUP, which would otherwise end the process: it reloads once serving.
    let hangups = hangup::reload_signal();
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(addr = %config.listen, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match server::serve_with(listener, config, shutdown, Some(hangups)).await {
        Ok(()) => ExitCode::SUCCESS,
        // Found only once starting (a venv that is not one): as those found before.
        Err(e @ server::ServeError::Config(_)) => {
            eprintln!("snakecage: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            tracing::error!(error = %e, "snakecage failed");
            ExitCode::FAILURE
        }
    }
}

/// rmcp's serve loop logs every MCP POST at INFO (three lines, one a dump of the client's
/// `initialize` params) and every error answer of a call at WARN (a client's argument
/// mistake, a call its client cancelled); its own failures are ERRORs, and stay.
const QUIET_RMCP: &str = "rmcp::service=error";

/// `spec` (`RUST_LOG` or `log.level`) with [`QUIET_RMCP`] added, unless it names an rmcp
/// target itself (an operator debugging MCP gets what they asked for).
fn with_quiet_rmcp(spec: &str) -> String {
    if spec.contains("rmcp") {
        spec.to_owned()
    } else if spec.trim().is_empty() {
        QUIET_RMCP.to_owned()
    } else {
        format!("{spec},{QUIET_RMCP}")
    }
}

fn init_logging(config: &Config) {
    let filter = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .and_then(|spec| EnvFilter::try_new(with_quiet_rmcp(&spec)).ok())
        .unwrap_or_else(|| EnvFilter::new(with_quiet_rmcp(&config.log.level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // A log line that cannot be written (stderr a pipe whose reader is gone) is dropped.
        // Reporting it would eprintln! to the same stderr, which panics, and the task that
        // logged dies: a SIGTERM's "shutting down" then left the service running for good.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A client that leaves an MCP call mid-way is normal, not an ERROR of rmcp's.
    let quiet = snakecage::mcp::gone_client::QuietGoneClients;
    match config.log.format {
        LogFormat::Json => builder.json().finish().with(quiet).init(),
        LogFormat::Human => builder.finish().with(quiet).init(),
    }
}
