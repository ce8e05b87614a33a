//! The keys CLI, `snakecage keys add | list`: keys stored only as hashes, names unique,
//! concurrent adds all land and the file keeps its comments, mode and owner; a missing
//! file to list is an error, and a file the service would refuse (an entry that does not
//! check) is refused by both commands, with the service's own words, and left unchanged.

use std::path::Path;
use std::process::Command;

use crate::auth::keys_add;
use crate::harness::repo_root;

#[tokio::test]
async fn keys_are_stored_only_as_hashes_and_names_are_unique() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let key = keys_add(&path, "alice", &["--max-concurrent", "3"]);
    assert!(key.starts_with("sc_") && key.len() == 67, "{key}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(&key) && !text.contains(&key[3..]), "{text}");
    let digest = sha256_hex(&key);
    assert!(text.contains(&digest), "{text}");
    assert!(text.contains("max_concurrent = 3"), "{text}");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the keys file is private");

    let again = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "add", "alice", "--keys-file"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert!(again.stdout.is_empty());
    // A name in another script is refused, and the refusal says which letters are meant.
    let cyrillic = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "add", "алиса", "--keys-file"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!cyrillic.status.success());
    let stderr = String::from_utf8_lossy(&cyrillic.stderr);
    assert!(stderr.contains("ASCII letter"), "{stderr}");
    assert!(cyrillic.stdout.is_empty());
    // A file in a directory that does not exist: say so, and how to create it.
    let missing = dir.path().join("etc/snakecage");
    let nowhere = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "add", "carol", "--keys-file"])
        .arg(missing.join("keys.toml"))
        .output()
        .unwrap();
    assert!(!nowhere.status.success());
    let stderr = String::from_utf8_lossy(&nowhere.stderr);
    assert!(
        stderr.contains(&format!(
            "the directory {} of keys file {}/keys.toml does not exist; create it first (e.g. \
             `install -d -m 700 {}`)",
            missing.display(),
            missing.display(),
            missing.display()
        )),
        "{stderr}"
    );
    assert!(nowhere.stdout.is_empty() && !missing.exists());
    keys_add(&path, "bob", &[]);
    let listed = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "list", "--keys-file"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&listed.stdout), "alice\nbob\n");
}

/// SHA-256 in hex, computed by Python's hashlib (an independent implementation).
fn sha256_hex(text: &str) -> String {
    let out = Command::new(repo_root().join(".venv/bin/python"))
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())",
            text,
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `snakecage keys list --keys-file PATH`: (exit status, stdout, stderr).
fn keys_list(path: &Path) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["keys", "list", "--keys-file"])
        .arg(path)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn concurrent_keys_adds_all_land_and_the_file_keeps_its_comments_mode_and_owner() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clés.toml");
    let comment = "# Clés de l'équipe « ops » : tournées chaque mois\n";
    std::fs::write(&path, comment).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    // Root can give the file to another owner, as an operator does (`chown snakecage`).
    let owner = if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        (65534, 65534)
    } else {
        let meta = std::fs::metadata(&path).unwrap();
        (meta.uid(), meta.gid())
    };

    let names: Vec<String> = (0..10).map(|i| format!("tenant-{i}")).collect();
    let adds: Vec<_> = names
        .iter()
        .map(|name| {
            Command::new(env!("CARGO_BIN_EXE_snakecage"))
                .args(["keys", "add", name, "--keys-file"])
                .arg(&path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut keys = Vec::new();
    for add in adds {
        let out = add.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        keys.push(String::from_utf8(out.stdout).unwrap().trim().to_owned());
    }

    let (status, listed, stderr) = keys_list(&path);
    assert!(status.success(), "{stderr}");
    let mut listed: Vec<&str> = listed.lines().collect();
    listed.sort();
    let mut expected: Vec<&str> = names.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(listed, expected);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with(comment), "{text}");
    for key in &keys {
        assert!(text.contains(&sha256_hex(key)), "{key} missing:\n{text}");
    }
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!((meta.uid(), meta.gid()), owner);
    // Nothing but the file and its lock is left beside it (no temporary files).
    let mut beside: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    beside.sort();
    assert_eq!(beside, ["clés.toml", "clés.toml.lock"]);
}

#[tokio::test]
async fn keys_list_of_a_missing_file_says_so_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tippfehler").join("schlüssel.toml");
    let (status, stdout, stderr) = keys_list(&path);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!("keys file {} does not exist", path.display())),
        "{stderr}"
    );
}

/// `snakecage keys ARGS…` with `env`: (exit code, stdout, stderr).
fn keys_cli(args: &[&str], path: &Path, env: &[(&str, &Path)]) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_snakecage"));
    command.arg("keys").args(args).arg("--keys-file").arg(path);
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The stranger's file: an entry whose `sha256` is no hash. `keys add` refuses it with the
/// service's own words (the key and what to fix) and writes nothing; `keys list` refuses
/// it too; the service, started with it, says the same. A name given twice by hand is
/// refused alike.
#[tokio::test]
async fn a_keys_file_the_service_refuses_is_refused_by_keys_add_and_list() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schlüssel.toml");
    let written = "# von Hand bearbeitet\n[[keys]]\nname = \"x\"\nsha256 = \"zz\"\n";
    std::fs::write(&path, written).unwrap();
    let service_says = "API key \"x\": sha256 must be 64 hex digits (the SHA-256 of the key)";

    let (code, stdout, stderr) = keys_cli(&["add", "y"], &path, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stdout, "", "no key is printed");
    assert!(
        stderr.contains(&format!("keys file {}: {service_says}", path.display()))
            && stderr.contains("fix or remove that entry; nothing was written"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), written);

    let (code, stdout, stderr) = keys_cli(&["list"], &path, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!("keys file {}: {service_says}", path.display())),
        "{stderr}"
    );

    // The service refuses the same file in the same words.
    let state = dir.path().join("state");
    let out = Command::new("timeout")
        .args(["60", env!("CARGO_BIN_EXE_snakecage")])
        .args(["--listen", "127.0.0.1:0", "--venv"])
        .arg(repo_root().join(".venv"))
        .env("SNAKECAGE_WORKER__STATE_DIR", &state)
        .env("SNAKECAGE_AUTH__KEYS_FILE", &path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let served = String::from_utf8_lossy(&out.stderr);
    assert!(served.contains(service_says), "{served}");

    // Fixed, the file takes the new key; a name written twice by hand is refused again.
    std::fs::write(&path, "").unwrap();
    keys_add(&path, "x", &[]);
    let text = std::fs::read_to_string(&path).unwrap();
    let twice = format!("{text}{}", &text[text.find("[[keys]]").unwrap()..]);
    std::fs::write(&path, &twice).unwrap();
    for args in [&["add", "y"][..], &["list"][..]] {
        let (code, stdout, stderr) = keys_cli(args, &path, &[]);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert_eq!(stdout, "", "{args:?}");
        assert!(
            stderr.contains("an API key named \"x\" already exists; key names are unique"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), twice);
}

/// The configured keys file is checked with the configuration's inline `[[auth.keys]]`, as
/// the service reads them together: a name taken inline cannot be added to the file.
#[tokio::test]
async fn keys_add_refuses_a_name_the_configuration_already_gives_inline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let config = dir.path().join("snakecage.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nkeys_file = {:?}\n\n[[auth.keys]]\nname = \"bob\"\nsha256 = \"{}\"\n",
            path.display().to_string(),
            "b".repeat(64)
        ),
    )
    .unwrap();
    let env = [("SNAKECAGE_CONFIG", config.as_path())];
    let (code, stdout, stderr) = keys_cli(&["add", "bob"], &path, &env);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains("an API key named \"bob\" already exists"),
        "{stderr}"
    );
    assert!(!path.exists(), "nothing was written");
    let (code, stdout, stderr) = keys_cli(&["add", "carol"], &path, &env);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("sc_"), "{stdout}");
    let (code, stdout, stderr) = keys_cli(&["list"], &path, &env);
    assert_eq!((code, stdout.as_str()), (Some(0), "carol\n"), "{stderr}");
}

/// A key allowed more sessions than the service holds (`sessions.max_sessions`) is added,
/// and the operator is told, with both numbers, that the global limit wins; `list` says
/// it again. A key within the limit gets no warning.
#[test]
fn a_key_allowed_more_sessions_than_the_service_holds_is_added_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let keys = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_snakecage"))
            .env("SNAKECAGE_SESSIONS__MAX_SESSIONS", "4")
            .args(args)
            .arg("--keys-file")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let warning = "snakecage: warning: API key 'zoe' has max_sessions = 10, above the \
                   service's sessions.max_sessions = 4: it can hold at most 4 sessions (fewer \
                   while other keys hold some); lower its max_sessions or raise \
                   sessions.max_sessions\n";
    let (key, stderr) = keys(&["keys", "add", "zoe", "--max-sessions", "10"]);
    assert!(key.starts_with("sc_"), "{key}");
    assert!(stderr.ends_with(warning), "{stderr}");
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("max_sessions = 10")
    );
    let (_, stderr) = keys(&["keys", "add", "yann", "--max-sessions", "4"]);
    assert!(!stderr.contains("warning"), "{stderr}");
    let (names, stderr) = keys(&["keys", "list"]);
    assert_eq!(names, "zoe\nyann\n");
    assert_eq!(stderr, warning);
}
