//! `snakecage keys add NAME | list`: the keys file, edited on this machine (no service
//! needed). Both check the whole file as the service does at start and on reload, and
//! refuse, non-zero, a file it would refuse: `add` then writes nothing.

use std::path::PathBuf;

use crate::auth::{ADMIN_SCOPE, KeyEntry, KeysError, KeysFile, sessions_above_global};
use crate::config::Config;

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
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

/// Runs `command`: what to print on stdout (a new key, the names), or the error to print.
/// The keys file is changed under a lock and replaced atomically.
pub fn run(command: KeysCommand, config: &Config) -> Result<String, String> {
    // The file, and the inline keys the service reads beside it: those of the
    // configuration when the file is the configured one.
    let file_of = |given: Option<PathBuf>| {
        let inline = match &given {
            Some(path) if Some(path) != config.auth.keys_file.as_ref() => Vec::new(),
            _ => config.auth.keys.clone(),
        };
        given
            .or_else(|| config.auth.keys_file.clone())
            .map(|path| (path, inline))
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
            if admin && !scopes.iter().any(|s| s == ADMIN_SCOPE) {
                scopes.push(ADMIN_SCOPE.to_owned());
            }
            let (path, inline) = file_of(keys_file)?;
            let limits = KeyEntry {
                max_concurrent,
                max_sessions,
                max_stored_mb,
                scopes,
                ..KeyEntry::default()
            };
            let key = KeysFile::add_beside(&path, &inline, &name, limits).map_err(|e| match e {
                KeysError::Refused { .. } => format!("{e}; nothing was written"),
                e => e.to_string(),
            })?;
            eprintln!(
                "snakecage: added key {name:?} to {} (only its SHA-256 is stored; this is the only time the key is shown)",
                path.display()
            );
            if let Some(warning) =
                sessions_above_global(&name, max_sessions, config.sessions.max_sessions)
            {
                eprintln!("snakecage: warning: {warning}");
            }
            Ok(format!("{key}\n"))
        }
        KeysCommand::List { keys_file } => {
            let (path, inline) = file_of(keys_file)?;
            if !path.exists() {
                return Err(KeysError::Missing { path }.to_string());
            }
            let file = KeysFile::read_checked(&path, &inline).map_err(|e| e.to_string())?;
            if file.keys.is_empty() {
                eprintln!("snakecage: {}", KeysError::Empty { path: path.clone() });
            }
            for key in &file.keys {
                let global = config.sessions.max_sessions;
                if let Some(warning) = sessions_above_global(&key.name, key.max_sessions, global) {
                    eprintln!("snakecage: warning: {warning}");
                }
            }
            Ok(file.keys.iter().map(|k| format!("{}\n", k.name)).collect())
        }
    }
}
