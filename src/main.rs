//! The `snakecage` binary: configuration, logging, bind, serve.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use snakecage::config::{Config, LogFormat, Overrides};
use snakecage::server;
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
    init_logging(&config);
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(addr = %config.listen, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    match server::serve(listener, config, server::shutdown_signal()).await {
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
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}
