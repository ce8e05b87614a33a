//! snakecage-worker: the zygote. Started once by the supervisor with exec; initialises
//! CPython, preloads the heavy modules, then forks one hardened worker per request.
//!
//! Usage: `snakecage-worker --control-fd FD --config JSON` (the supervisor writes both).

mod child;
mod hooks;
mod hugepages;
mod immortal;
mod interpreter;
mod jobsocket;
mod packages;
mod priority;
mod reserve;
mod sandbox;
mod snapshot;
mod stack;
mod tools;
mod zygote;

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;

use snakecage_worker::protocol::ZygoteConfig;

/// The system allocator, with each worker's emergency reserve (see [`reserve`]).
#[global_allocator]
static ALLOCATOR: reserve::WithReserve = reserve::WithReserve;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("snakecage-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let (control_fd, config) = parse_args()?;
    // SAFETY: the supervisor passed this fd to us on exec and nothing else in this process
    // owns it.
    let control = unsafe { OwnedFd::from_raw_fd(control_fd) };
    zygote::run(control, config).map_err(|e| e.to_string())
}

fn parse_args() -> Result<(RawFd, ZygoteConfig), String> {
    let mut control_fd = None;
    let mut config = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--control-fd" => {
                control_fd = Some(
                    value
                        .parse()
                        .map_err(|_| format!("bad --control-fd {value:?}"))?,
                )
            }
            "--config" => {
                config =
                    Some(serde_json::from_str(&value).map_err(|e| format!("bad --config: {e}"))?)
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((
        control_fd.ok_or("--control-fd is required")?,
        config.ok_or("--config is required")?,
    ))
}
