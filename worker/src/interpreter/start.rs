//! Starting CPython: UTF-8 and isolated mode, `site` off, no bytecode written.

use std::ffi::{CString, c_char};
use std::mem::MaybeUninit;
use std::path::PathBuf;

use pyo3::ffi;
use pyo3::prelude::*;
use snakecage_worker::protocol::ZygoteConfig;

use super::InterpreterError;

/// Initialises CPython: UTF-8 mode (PEP 540), isolated mode (no environment variables, no
/// user site, no `sys.path[0]`), `site` off, bytecode never written, signal handlers
/// installed (SIGINT becomes KeyboardInterrupt in sessions).
pub fn initialize(config: &ZygoteConfig) -> Result<(), InterpreterError> {
    let home = python_home(config);
    if !home.is_dir() {
        return Err(InterpreterError::MissingHome(home));
    }
    pre_initialize_utf8()?;
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
        // Output is UTF-8 whatever locale the zygote was started in (an isolated config
        // with the C locale would make it ASCII, and `print('é')` would fail).
        let status = ffi::PyConfig_SetBytesString(cfg, &mut cfg.stdio_encoding, c"utf-8".as_ptr());
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

/// Pre-initialises CPython in UTF-8 mode. A worker's environment is cleared and its locale
/// is "C", which would make stdio, file names and `open()` ASCII; UTF-8 mode makes all of
/// them UTF-8 whatever the host's locale (stdio with `surrogateescape` on stdin/stdout,
/// file names with `surrogateescape`). It must be set before the interpreter is configured.
fn pre_initialize_utf8() -> Result<(), InterpreterError> {
    let mut raw = MaybeUninit::<ffi::PyPreConfig>::uninit();
    // SAFETY: PyPreConfig_InitIsolatedConfig fully initialises the struct it is given;
    // Py_PreInitialize only reads it; PyStatus is a plain value.
    let status = unsafe {
        ffi::PyPreConfig_InitIsolatedConfig(raw.as_mut_ptr());
        let pre = raw.assume_init_mut();
        pre.utf8_mode = 1;
        ffi::Py_PreInitialize(pre)
    };
    // SAFETY: see above.
    if unsafe { ffi::PyStatus_Exception(status) } == 0 {
        return Ok(());
    }
    Err(InterpreterError::Init(status_message(&status)))
}

/// The text of a failed PyStatus.
fn status_message(status: &ffi::PyStatus) -> String {
    if status.err_msg.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: a non-null err_msg is a static NUL-terminated string owned by CPython.
        unsafe { std::ffi::CStr::from_ptr(status.err_msg as *const c_char) }
            .to_string_lossy()
            .into_owned()
    }
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
    let msg = status_message(&status);
    // SAFETY: see above; clearing releases the strings the config owns.
    unsafe { ffi::PyConfig_Clear(cfg) };
    Err(InterpreterError::Init(msg))
}

pub fn python_version() -> String {
    Python::version_str()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}
