//! The `snakecage` binary: configuration, logging, bind, serve.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use snakecage::auth::{KeyEntry, KeysError, KeysFile};
use snakecage::config::{Config, LogFormat, Overrides};
use snakecage::{hangup, server, shutdown};
use tracing_subscriber::EnvFilter;

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
    Keys(KeysCommand),
    /// Manage the Python packages of a running service (admin API key).
    Packages(snakecage::cli::packages::PackagesArgs),
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Creates a key for tenant NAME, stores its hash and prints the key (once: it is kept
    /// nowhere).
    Add {
        name: String,
        /// The keys file; default: `auth.keys_file` of the configuration.
        #[arg(long)]
        keys_file: Option<PathBuf>,
        /// Executions this key may have running at once.
        #[arg(long)]
        max_concurrent: Option<usize>,
        /// Sessions this key may hold at once.
        #[arg(long)]
        max_sessions: Option<usize>,
        /// Total size of the files this key may keep stored, in MB.
        #[arg(long)]
        max_stored_mb: Option<u64>,
        /// Gives the key the admin scope: `/v1/admin/*` (reload, packages).
        #[arg(long)]
        admin: bool,
        /// A scope to give the key (repeatable); `admin` is the only one.
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
    },
    /// Lists the names (tenants) in the keys file.
    List {
        #[arg(long)]
        keys_file: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
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
        return match keys(command, &config) {
            Ok(()) => ExitCode::SUCCESS,
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
        Err(e) => {
            tracing::error!(error = %e, "snakecage failed");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(config: &Config) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // A log line that cannot be written (stderr a pipe whose reader is gone) is dropped.
        // Reporting it would eprintln! to the same stderr, which panics, and the task that
        // logged dies: a SIGTERM's "shutting down" then left the service running for good.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

/// `snakecage keys …`: the keys file is changed under a lock and replaced atomically; a new
/// key goes to stdout.
fn keys(command: KeysCommand, config: &Config) -> Result<(), String> {
    let file_of = |given: Option<PathBuf>| {
        given
            .or_else(|| config.auth.keys_file.clone())
            .ok_or_else(|| {
                "give --keys-file PATH or set auth.keys_file in the configuration".to_owned()
            })
    };
    match command {
        KeysCommand::Add {
            name,
            keys_file,
            max_concurrent,
            max_sessions,
            max_stored_mb,
            admin,
            mut scopes,
        } => {
            if admin && !scopes.iter().any(|s| s == snakecage::auth::ADMIN_SCOPE) {
                scopes.push(snakecage::auth::ADMIN_SCOPE.to_owned());
            }
            let path = file_of(keys_file)?;
            let limits = KeyEntry {
                max_concurrent,
                max_sessions,
                max_stored_mb,
                scopes,
                ..KeyEntry::default()
            };
            let key = KeysFile::add_to(&path, &name, limits).map_err(|e| e.to_string())?;
            eprintln!(
                "snakecage: added key {name:?} to {} (only its SHA-256 is stored; this is the only time the key is shown)",
                path.display()
            );
            println!("{key}");
        }
        KeysCommand::List { keys_file } => {
            let path = file_of(keys_file)?;
            if !path.exists() {
                return Err(KeysError::Missing { path }.to_string());
            }
            for key in KeysFile::read(&path).map_err(|e| e.to_string())?.keys {
                println!("{}", key.name);
            }
        }
    }
    Ok(())
}
