//! What hostile code must not reach or leave behind on the host: bait outside any
//! workspace (a secret file, a TCP listener), secrets planted in other workers'
//! workspaces, and the checks that nothing outside the workspaces changed.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::fixture::WORKER_UIDS;
use crate::harness::Server;

/// Things on the host that hostile code must not reach: a secret file outside any
/// workspace (readable by every uid, so only the sandbox stops a read) and a TCP listener.
pub(crate) struct HostBait {
    dir: tempfile::TempDir,
    listener: TcpListener,
}

impl HostBait {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).unwrap();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "host secret\n").unwrap();
        std::fs::set_permissions(&secret, PermissionsExt::from_mode(0o666)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Self { dir, listener }
    }

    pub(super) fn secret(&self) -> String {
        self.dir.path().join("secret.txt").display().to_string()
    }

    pub(super) fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }

    /// The bait is untouched: same single file, same content, and nobody connected.
    pub(crate) fn assert_untouched(&self) {
        let names: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec!["secret.txt"],
            "files appeared next to the secret"
        );
        assert_eq!(
            std::fs::read_to_string(self.secret()).unwrap(),
            "host secret\n",
            "the host secret was changed"
        );
        match self.listener.accept() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a worker reached the host's TCP listener: {other:?}"),
        }
    }
}

/// After a hostile suite: the service is healthy on the zygote it started with, the bait
/// is untouched and nothing was written where the fixtures tried to. Returns the health.
pub(super) async fn assert_unharmed(s: &Server, zygote_pid: &Value, bait: &HostBait) -> Value {
    let after = s.health().await;
    assert_eq!(after["status"], "ok", "{after}");
    assert_eq!(
        &after["pool"]["zygote"]["pid"], zygote_pid,
        "the zygote died"
    );
    bait.assert_untouched();
    assert!(!Path::new("/tmp/snakecage-escape").exists());
    after
}

/// Writes `secret.txt` into every other worker's workspace that exists right now.
/// Bytes under the service's workspace roots (`workspaces-<pid>`), not its file store.
pub(super) fn workspaces_size(state_dir: &Path) -> u64 {
    std::fs::read_dir(state_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("workspaces-"))
        .map(|e| size_of_tree(&e.path()))
        .sum()
}

pub(super) fn plant_secrets_in_workspaces(state_dir: &Path) -> usize {
    crate::harness::workspaces_under(state_dir)
        .iter()
        .filter(|ws| std::fs::write(ws.join("secret.txt"), "other tenant\n").is_ok())
        .count()
}

/// Files owned by a worker uid outside any workspace, under `roots`.
pub(super) fn worker_files_outside_workspaces(roots: &[PathBuf]) -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>, depth: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let in_workspace = path
                .components()
                .any(|c| c.as_os_str().to_string_lossy().starts_with("workspaces-"));
            if WORKER_UIDS.contains(&meta.uid()) && !in_workspace {
                found.push(path.clone());
            }
            if meta.is_dir() && !in_workspace && depth < 6 {
                walk(&path, found, depth + 1);
            }
        }
    }
    let mut found = Vec::new();
    for root in roots {
        walk(root, &mut found, 0);
    }
    found
}

fn size_of_tree(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => size_of_tree(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
