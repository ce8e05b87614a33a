//! Hostile fixtures: tiny programs written by someone who knows CPython's escape tricks.
//! Each one must be stopped with an exact denial that the user sees as a result (stderr,
//! exit code 1, verdict), never as a 5xx.
//!
//! Two servers. One with every layer on (and required): most fixtures meet the Python
//! layer first, the audit hook or the import guard, whose messages name what was denied.
//! One with the Python layer switched off: the same attacks meet the OS layers (seccomp,
//! Landlock, namespaces), which are the real boundary. After the hostile suite the
//! service is healthy, nothing it started is left behind and no file outside the
//! workspaces changed.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Options, Server, descendants_of, process_exists};

/// Every layer: the hostile suite refuses to run on a host where one is missing.
pub(crate) const ALL_LAYERS: &str = r#"["network_namespace", "mount_namespace", "rlimits", "drop_privileges", "no_new_privs", "landlock", "seccomp", "audit_hook", "import_guard"]"#;
pub(crate) const OS_LAYERS: &str = r#"["network_namespace", "mount_namespace", "rlimits", "drop_privileges", "no_new_privs", "landlock", "seccomp"]"#;
/// The uid workers drop to by default.
const WORKER_UID: u32 = 65534;

/// One hostile program and what the user must see.
pub(crate) struct Fixture {
    name: &'static str,
    code: String,
    timeout_ms: Option<u64>,
    expect: Expect,
}

enum Expect {
    /// An uncaught exception: exit code 1, verdict error, this last stderr line.
    Denied(String),
    /// Ran to the end (it caught the denial itself) and printed exactly this.
    Prints(String),
    /// The worker died (e.g. SIGSEGV): verdict killed, no exit code.
    Killed,
    /// Killed at its deadline.
    TimedOut,
}

fn denied(name: &'static str, code: impl Into<String>, last_line: impl Into<String>) -> Fixture {
    Fixture {
        name,
        code: code.into(),
        timeout_ms: None,
        expect: Expect::Denied(last_line.into()),
    }
}

fn prints(name: &'static str, code: impl Into<String>, stdout: impl Into<String>) -> Fixture {
    Fixture {
        name,
        code: code.into(),
        timeout_ms: None,
        expect: Expect::Prints(stdout.into()),
    }
}

fn audit(event: &str) -> String {
    format!("PermissionError: '{event}' is not allowed in this sandbox")
}

fn import_denied(module: &str) -> String {
    format!("ImportError: import of '{module}' is not allowed in this sandbox")
}

fn write_denied(path: &str) -> String {
    format!(
        "PermissionError: 'open' for writing outside the workspace is not allowed in this sandbox: \"{path}\""
    )
}

const EPERM: &str = "PermissionError: [Errno 1] Operation not permitted";

fn eacces(path: &str) -> String {
    format!("PermissionError: [Errno 13] Permission denied: '{path}'")
}

/// Runs every fixture and returns one message per fixture that was not stopped as expected.
pub(crate) async fn run_fixtures(s: &Server, fixtures: Vec<Fixture>) -> Vec<String> {
    let mut failures = Vec::new();
    for f in fixtures {
        let mut body = json!({ "code": f.code });
        if let Some(ms) = f.timeout_ms {
            body["timeout_ms"] = json!(ms);
        }
        let (status, r) = s.post("/v1/execute", &body).await;
        if status != 200 {
            failures.push(format!(
                "{}: HTTP {status} (a denial must be a result): {r}",
                f.name
            ));
            continue;
        }
        let stderr = r["stderr"].as_str().unwrap_or_default();
        let last = stderr.trim_end().lines().last().unwrap_or_default();
        let ok = match &f.expect {
            Expect::Denied(line) => {
                r["exit_code"] == 1 && r["verdict"] == "error" && last == line.as_str()
            }
            Expect::Prints(out) => r["exit_code"] == 0 && r["stdout"] == out.as_str(),
            Expect::Killed => r["verdict"] == "killed" && r["exit_code"].is_null(),
            Expect::TimedOut => r["verdict"] == "timeout" && r["timed_out"] == true,
        };
        if !ok {
            let want = match &f.expect {
                Expect::Denied(line) => format!("exit 1, stderr ending {line:?}"),
                Expect::Prints(out) => format!("exit 0, stdout {out:?}"),
                Expect::Killed => "verdict killed".into(),
                Expect::TimedOut => "verdict timeout".into(),
            };
            failures.push(format!(
                "{}: expected {want}; got verdict {} exit {} stdout {:?} stderr {:?}",
                f.name, r["verdict"], r["exit_code"], r["stdout"], stderr
            ));
        }
    }
    failures
}

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

    fn secret(&self) -> String {
        self.dir.path().join("secret.txt").display().to_string()
    }

    fn port(&self) -> u16 {
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

/// Writes `secret.txt` into every other worker's workspace that exists right now.
/// Bytes under the service's workspace roots (`workspaces-<pid>`), not its file store.
fn workspaces_size(state_dir: &Path) -> u64 {
    std::fs::read_dir(state_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("workspaces-"))
        .map(|e| size_of_tree(&e.path()))
        .sum()
}

fn plant_secrets_in_workspaces(state_dir: &Path) -> usize {
    let mut planted = 0;
    for root in std::fs::read_dir(state_dir).unwrap().flatten() {
        if !root
            .file_name()
            .to_string_lossy()
            .starts_with("workspaces-")
        {
            continue;
        }
        for ws in std::fs::read_dir(root.path()).unwrap().flatten() {
            if std::fs::write(ws.path().join("secret.txt"), "other tenant\n").is_ok() {
                planted += 1;
            }
        }
    }
    planted
}

/// Files owned by the worker uid outside any workspace, under `roots`.
fn worker_files_outside_workspaces(roots: &[PathBuf]) -> Vec<PathBuf> {
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
            if meta.uid() == WORKER_UID && !in_workspace {
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

fn python_layer_fixtures(bait: &HostBait, zygote_pid: i64) -> Vec<Fixture> {
    let secret = bait.secret();
    let port = bait.port();
    vec![
        // Process creation.
        denied(
            "import subprocess",
            "import subprocess",
            import_denied("subprocess"),
        ),
        denied("import pty", "import pty", import_denied("pty")),
        denied(
            "import multiprocessing",
            "import multiprocessing",
            import_denied("multiprocessing"),
        ),
        denied(
            "os.system through __import__",
            "__import__('os').system('id')",
            audit("os.system"),
        ),
        denied("os.fork", "import os\nos.fork()", audit("os.fork")),
        denied(
            "os.execv",
            "import os\nos.execv('/bin/sh', ['sh', '-c', 'id'])",
            audit("os.exec"),
        ),
        denied(
            "os.posix_spawn",
            "import os\nos.posix_spawn('/bin/id', ['id'], {})",
            audit("os.posix_spawn"),
        ),
        denied(
            "fork bomb",
            "import os\nwhile True:\n    os.fork()",
            audit("os.fork"),
        ),
        denied(
            "subprocess taken from sys.modules",
            "import sys\nsys.modules['subprocess'].run(['id'])",
            audit("subprocess.Popen"),
        ),
        denied(
            "__subclasses__ gadget to Popen",
            "popen = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]\npopen(['id'])",
            audit("subprocess.Popen"),
        ),
        denied(
            "__subclasses__ gadget to os.system through __globals__",
            "wrap = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]\nwrap.__init__.__globals__['system']('id')",
            audit("os.system"),
        ),
        denied(
            "builtins.__import__ replaced to bypass the guard",
            "import builtins, sys\nbuiltins.__import__ = lambda name, *a, **k: sys.modules[name]\nimport subprocess\nsubprocess.run(['id'])",
            audit("subprocess.Popen"),
        ),
        denied(
            "sys.modules entry deleted, then re-imported",
            "import sys\ndel sys.modules['subprocess']\nimport subprocess",
            import_denied("subprocess"),
        ),
        denied(
            "importlib behind the guard's back",
            "import sys\nsys.modules['importlib'].import_module('subprocess').run(['id'])",
            audit("subprocess.Popen"),
        ),
        denied(
            "__import__ mimicking C code (empty-list fromlist)",
            "__import__('subprocess', None, None, []).run(['id'])",
            audit("subprocess.Popen"),
        ),
        denied(
            "import run in a library module's globals",
            "import numpy\nexec(\"import subprocess\\nsubprocess.run(['id'])\", vars(numpy))",
            audit("subprocess.Popen"),
        ),
        // Network.
        denied(
            "import socket",
            format!("import socket\nsocket.create_connection(('127.0.0.1', {port}))"),
            import_denied("socket"),
        ),
        denied(
            "TCP connection to a listener on the host",
            format!(
                "import sys\nsys.modules['socket'].socket().connect(('127.0.0.1', {port}))"
            ),
            audit("socket.__new__"),
        ),
        denied(
            "DNS lookup",
            "import sys\nsys.modules['socket'].getaddrinfo('example.com', 443)",
            audit("socket.getaddrinfo"),
        ),
        // Native code.
        denied("import ctypes", "import ctypes", import_denied("ctypes")),
        denied(
            "ctypes.CDLL(None)",
            "import sys\nsys.modules['ctypes'].CDLL(None)",
            audit("ctypes.dlopen"),
        ),
        denied(
            "ctypes.pythonapi to reach PySys_AddAuditHook",
            "import sys\nsys.modules['ctypes'].pythonapi.PySys_AddAuditHook",
            audit("ctypes.dlsym"),
        ),
        // Files.
        denied(
            "reading /etc/shadow",
            "print(open('/etc/shadow').read())",
            eacces("/etc/shadow"),
        ),
        denied(
            "reading a host secret outside the workspace",
            format!("print(open('{secret}').read())"),
            eacces(&secret),
        ),
        denied(
            "writing the host secret",
            format!("open('{secret}', 'w').write('pwned')"),
            write_denied(&secret),
        ),
        denied(
            "os.open for writing outside the workspace",
            "import os\nos.open('/tmp/snakecage-escape', os.O_WRONLY | os.O_CREAT)",
            write_denied("/tmp/snakecage-escape"),
        ),
        denied(
            "symlink in the workspace pointing out",
            "import os\nos.symlink('/etc/passwd', 'link')\nopen('link', 'a').write('x')",
            eacces("link"),
        ),
        denied(
            "listing the other workspaces",
            "import os\nprint(os.listdir('..'))",
            eacces(".."),
        ),
        denied(
            "/proc/self/mem write",
            "open('/proc/self/mem', 'wb')",
            write_denied("/proc/self/mem"),
        ),
        // Introspection and the hooks themselves.
        denied("import gc", "import gc", import_denied("gc")),
        denied(
            "gc.get_objects() hunting",
            "import sys\nsys.modules['gc'].get_objects()",
            audit("gc.get_objects"),
        ),
        denied(
            "gc.get_referrers",
            "import sys\nsys.modules['gc'].get_referrers(sys)",
            audit("gc.get_referrers"),
        ),
        prints(
            "adding an audit hook (CPython drops it silently)",
            "import sys\ncalls = []\nsys.addaudithook(lambda event, args: calls.append(event))\nopen('probe.txt', 'w').close()\nprint(calls)",
            "[]\n",
        ),
        denied(
            "sys.settrace",
            "import sys\nsys.settrace(lambda *a: None)",
            audit("sys.settrace"),
        ),
        denied(
            "sys.setprofile",
            "import sys\nsys.setprofile(lambda *a: None)",
            audit("sys.setprofile"),
        ),
        denied(
            "sys._current_frames",
            "import sys\nsys._current_frames()",
            audit("sys._current_frames"),
        ),
        denied(
            "os.putenv (LD_PRELOAD)",
            "import os\nos.environ['LD_PRELOAD'] = '/tmp/evil.so'",
            audit("os.putenv"),
        ),
        denied(
            "import resource",
            "import resource",
            import_denied("resource"),
        ),
        // Other processes.
        denied(
            "os.kill(os.getppid(), 9)",
            "import os\nos.kill(os.getppid(), 9)",
            audit("os.kill"),
        ),
        denied(
            "SIGKILL to the zygote by pid",
            format!("import os\nos.kill({zygote_pid}, 9)"),
            audit("os.kill"),
        ),
        denied(
            "signal.pthread_kill",
            "import sys, threading\nsys.modules['signal'].pthread_kill(threading.main_thread().ident, 9)",
            audit("signal.pthread_kill"),
        ),
        prints(
            "the worker runs unprivileged with a fixed environment",
            "import os\nprint(os.getuid(), os.getgid(), os.getgroups(), 'HOST_API_TOKEN' in os.environ)",
            format!("{WORKER_UID} {WORKER_UID} [] False\n"),
        ),
        // Resource exhaustion.
        prints(
            "thread bomb",
            "import threading, time\ntry:\n    while True:\n        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\nexcept RuntimeError as e:\n    print(e)",
            "can't start new thread\n",
        ),
        prints(
            "fd exhaustion",
            "import os\ntry:\n    while True:\n        os.open('/dev/null', os.O_RDONLY)\nexcept OSError as e:\n    print(e)",
            "[Errno 24] Too many open files: '/dev/null'\n",
        ),
        denied(
            "a 10 GB file",
            "with open('big', 'wb') as f:\n    f.seek(10 * 2**30)\n    f.write(b'x')",
            "OSError: [Errno 27] File too large",
        ),
        Fixture {
            name: "disk fill",
            code: "chunk = b'\\0' * (1 << 20)\ni = 0\nwhile True:\n    with open(f'fill{i}', 'wb') as f:\n        for _ in range(100):\n            f.write(chunk)\n    i += 1".into(),
            timeout_ms: Some(1000),
            expect: Expect::TimedOut,
        },
        denied(
            "deep recursion",
            "def f(n):\n    return f(n + 1)\nf(0)",
            "RecursionError: maximum recursion depth exceeded",
        ),
        Fixture {
            name: "sys.setrecursionlimit(10**9) and C-level recursion (segfault)",
            code: "import sys\nsys.setrecursionlimit(10**9)\nclass A:\n    def __repr__(self):\n        return repr(self)\nrepr(A())".into(),
            timeout_ms: Some(10_000),
            expect: Expect::Killed,
        },
    ]
}

pub(crate) fn os_layer_fixtures(bait: &HostBait, supervisor_pid: u32) -> Vec<Fixture> {
    let secret = bait.secret();
    let port = bait.port();
    let mut fixtures = vec![
        denied("os.fork (seccomp)", "import os\nos.fork()", EPERM),
        denied(
            "fork bomb (seccomp)",
            "import os\nwhile True:\n    os.fork()",
            EPERM,
        ),
        denied(
            "os.execv (seccomp)",
            "import os\nos.execv('/bin/sh', ['sh'])",
            EPERM,
        ),
        denied(
            "subprocess.run (seccomp)",
            "import subprocess\nsubprocess.run(['id'])",
            EPERM,
        ),
        denied(
            "os.posix_spawn (seccomp)",
            "import os\nos.posix_spawn('/bin/id', ['id'], {})",
            format!("{EPERM}: '/bin/id'"),
        ),
        denied(
            "TCP connection to the host (seccomp, empty netns)",
            format!("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"),
            EPERM,
        ),
        denied(
            "DNS lookup (no sockets, no resolver files)",
            "import socket\nsocket.getaddrinfo('example.com', 443)",
            "socket.gaierror: [Errno -3] Temporary failure in name resolution",
        ),
        denied(
            "reading /etc/shadow (Landlock)",
            "open('/etc/shadow').read()",
            eacces("/etc/shadow"),
        ),
        denied(
            "reading a host secret (Landlock)",
            format!("open('{secret}').read()"),
            eacces(&secret),
        ),
        denied(
            "writing outside the workspace (Landlock)",
            "open('/tmp/snakecage-escape', 'w')",
            eacces("/tmp/snakecage-escape"),
        ),
        // matplotlib's shared config dir passes `access(W_OK)` (mode 1777) for workers of
        // tiers that import matplotlib late; Landlock still keeps it read-only.
        prints(
            "writing into matplotlib's shared config dir (Landlock)",
            "import os\nd = os.environ['MPLCONFIGDIR']\nprint(os.access(d, os.W_OK))\nfor f in ('matplotlibrc', 'fontlist-v999.json'):\n    try:\n        open(os.path.join(d, f), 'w')\n    except OSError as e:\n        print(e.errno, e.strerror)",
            "True\n13 Permission denied\n13 Permission denied\n",
        ),
        denied(
            "/proc/self/mem write (Landlock)",
            "open('/proc/self/mem', 'wb')",
            eacces("/proc/self/mem"),
        ),
        denied(
            "os.kill(os.getppid(), 9) (Landlock signal scope)",
            "import os\nos.kill(os.getppid(), 9)",
            EPERM,
        ),
        denied(
            "SIGKILL to the supervisor (Landlock signal scope)",
            format!("import os\nos.kill({supervisor_pid}, 9)"),
            EPERM,
        ),
        prints(
            "writing into the Python prefix",
            "import sys\ntry:\n    open(sys.base_prefix + '/lib/python3.11/os.py', 'a')\nexcept OSError as e:\n    print(e.errno, e.strerror)",
            "13 Permission denied\n",
        ),
        denied("setuid(0) after the drop", "import os\nos.setuid(0)", EPERM),
        denied(
            "listing /root (tmpfs in the zygote's mount namespace, Landlock)",
            "import os\nprint(os.listdir('/root'))",
            eacces("/root"),
        ),
    ];
    if cfg!(target_arch = "x86_64") {
        // Raw syscalls through ctypes: no Python-level check can see these.
        let raw = |name: &'static str, call: &str| {
            prints(
                name,
                format!(
                    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = {call}\nprint(r, os.strerror(ctypes.get_errno()))"
                ),
                "-1 Operation not permitted\n",
            )
        };
        fixtures.push(raw("raw fork syscall (seccomp)", "libc.syscall(57)"));
        fixtures.push(raw(
            "unshare(CLONE_NEWUSER) (seccomp)",
            "libc.unshare(0x10000000)",
        ));
        fixtures.push(raw(
            "ptrace(PTRACE_ATTACH, zygote) (seccomp)",
            "libc.ptrace(16, os.getppid(), 0, 0)",
        ));
        fixtures.push(raw("socket(AF_NETLINK) (seccomp)", "libc.socket(16, 3, 0)"));
        // The policy is split: the zygote installs the bulk once (inherited), each worker
        // adds process creation, which the zygote itself needs. Both halves must hold in
        // a worker: the per-worker one...
        fixtures.push(raw(
            "raw vfork syscall (seccomp, per worker)",
            "libc.syscall(58)",
        ));
        fixtures.push(raw(
            "raw clone(SIGCHLD), a fork by another name (seccomp, per worker)",
            "libc.syscall(56, 17, 0, 0, 0, 0)",
        ));
        // ...and the inherited one.
        fixtures.push(raw(
            "raw execveat syscall (seccomp, inherited from the zygote)",
            "libc.syscall(322, -100, b'/bin/sh', 0, 0, 0)",
        ));
        fixtures.push(raw(
            "bpf() (seccomp, inherited from the zygote)",
            "libc.syscall(321, 0, 0, 0)",
        ));
        fixtures.push(raw(
            "io_uring_setup (seccomp, inherited from the zygote)",
            "libc.syscall(425, 1, 0)",
        ));
        fixtures.push(raw(
            "keyctl (seccomp, inherited from the zygote)",
            "libc.syscall(250, 0, 0, 0, 0, 0)",
        ));
        fixtures.push(prints(
            "clone3 answers ENOSYS so glibc falls back to the checked clone (seccomp, inherited)",
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.syscall(435, 0, 0)\nprint(r, os.strerror(ctypes.get_errno()))",
            "-1 Function not implemented\n",
        ));
        // Threads still start: clone with CLONE_THREAD stays allowed.
        fixtures.push(prints(
            "a Python thread starts (clone with CLONE_THREAD is allowed)",
            "import threading\nout = []\nt = threading.Thread(target=out.append, args=(7,))\nt.start()\nt.join()\nprint(out)",
            "[7]\n",
        ));
    }
    fixtures
}

/// `tiers.profile` with one tier preloading everything the default tiers preload.
const FULL_TIER_ONLY: &str =
    r#"[{name = "full", preload = ["numpy", "pandas", "matplotlib", "matplotlib.pyplot"]}]"#;

#[tokio::test]
async fn hostile_programs_are_stopped_by_the_python_layer_with_exact_messages() {
    let bait = HostBait::new();
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)
            .env("HOST_API_TOKEN", "supervisor-only")
            // One tier with everything preloaded: the gadgets below reach for modules
            // (subprocess, socket, signal) that only a full zygote has in memory, so every
            // fixture meets the most a worker can hold. A lighter tier holds a subset.
            .env("SNAKECAGE_TIERS__PROFILE", FULL_TIER_ONLY),
    )
    .await;
    let health = s.health().await;
    for layer in ["landlock", "seccomp", "audit_hook", "import_guard"] {
        assert_eq!(health["sandbox"][layer]["state"], "active", "{health}");
    }
    let zygote_pid = health["pool"]["zygote"]["pid"].as_i64().unwrap();

    let mut failures = run_fixtures(&s, python_layer_fixtures(&bait, zygote_pid)).await;

    // Another worker's workspace: plant a secret in every idle worker's directory, then
    // try to read each sibling's.
    s.wait_for_idle(2).await;
    let planted = plant_secrets_in_workspaces(s.state_dir());
    assert!(planted >= 1, "no idle workspace to plant a secret in");
    let probe = "import os\nroot, mine = os.path.split(os.getcwd())\nseen = set()\nfor n in range(1, 500):\n    if f'w{n}' == mine:\n        continue\n    try:\n        open(os.path.join(root, f'w{n}', 'secret.txt')).read()\n        seen.add('READ')\n    except PermissionError:\n        seen.add('denied')\n    except FileNotFoundError:\n        pass\nprint(sorted(seen))";
    failures.extend(
        run_fixtures(
            &s,
            vec![prints(
                "reading another worker's workspace",
                probe,
                "['denied']\n",
            )],
        )
        .await,
    );
    assert!(
        failures.is_empty(),
        "{} fixture(s) escaped or were stopped differently:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The service is healthy, on the same zygote, and serves the next request.
    let after = s.health().await;
    assert_eq!(after["status"], "ok", "{after}");
    assert_eq!(
        after["pool"]["zygote"]["pid"], zygote_pid,
        "the zygote died"
    );
    assert_eq!(after["pool"]["zygote_restarts"], 0, "{after}");
    assert_eq!(s.run("print(6 * 7)").await["stdout"], "42\n");

    // The disk filler's files went with its workspace (what a run writes is also stored
    // in the file store, bounded by workspace.max_total_mb and files.quota_mb: not measured
    // here).
    let deadline = Instant::now() + Duration::from_secs(5);
    while workspaces_size(s.state_dir()) > 50 << 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        workspaces_size(s.state_dir()) <= 50 << 20,
        "workspaces were not cleaned up: {} bytes left",
        workspaces_size(s.state_dir())
    );

    // Nothing outside the workspaces changed.
    bait.assert_untouched();
    assert!(!Path::new("/tmp/snakecage-escape").exists());
    let roots = ["/tmp", "/var/tmp", "/dev/shm", "/etc", "/root"].map(PathBuf::from);
    let stray = worker_files_outside_workspaces(&roots);
    assert!(
        stray.is_empty(),
        "files owned by the worker uid outside any workspace: {stray:?}"
    );

    // No process it started is left behind.
    let below = descendants_of(s.pid());
    let status = s.stop();
    assert!(status.success(), "{status:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while below.iter().any(|&p| process_exists(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = below.into_iter().filter(|&p| process_exists(p)).collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[tokio::test]
async fn with_the_python_layer_off_the_os_layers_still_stop_every_escape() {
    let bait = HostBait::new();
    let s = Server::start_with(
        Options::default()
            .env("SNAKECAGE_SANDBOX__REQUIRE", OS_LAYERS)
            .env(
                "SNAKECAGE_SANDBOX__LAYERS_OFF",
                r#"["audit_hook", "import_guard"]"#,
            ),
    )
    .await;
    let health = s.health().await;
    assert_eq!(health["sandbox"]["audit_hook"]["state"], "off", "{health}");
    assert!(
        s.log().contains("SANDBOX LAYER SWITCHED OFF"),
        "switching a layer off must be logged loudly"
    );
    let zygote_pid = health["pool"]["zygote"]["pid"].clone();

    let failures = run_fixtures(&s, os_layer_fixtures(&bait, s.pid())).await;
    assert!(
        failures.is_empty(),
        "{} fixture(s) escaped the OS layers or were stopped differently:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let after = s.health().await;
    assert_eq!(after["status"], "ok", "{after}");
    assert_eq!(
        after["pool"]["zygote"]["pid"], zygote_pid,
        "the zygote died"
    );
    bait.assert_untouched();
    assert!(!Path::new("/tmp/snakecage-escape").exists());
}

#[tokio::test]
async fn health_reports_every_layer_and_requiring_a_switched_off_layer_fails_start_up() {
    let s = Server::start().await;
    let h = s.health().await;
    let sandbox = h["sandbox"].as_object().expect("sandbox in /health");
    for layer in [
        "network_namespace",
        "mount_namespace",
        "rlimits",
        "drop_privileges",
        "no_new_privs",
        "landlock",
        "seccomp",
        "audit_hook",
        "import_guard",
    ] {
        let state = &sandbox[layer]["state"];
        assert!(
            matches!(state, Value::String(s) if ["active", "off", "unavailable"].contains(&s.as_str())),
            "{layer}: {state}"
        );
        assert!(sandbox[layer]["detail"].is_string(), "{layer}");
    }
    drop(s);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snakecage"))
        .args(["--listen", "127.0.0.1:0"])
        .env("SNAKECAGE_SANDBOX__REQUIRE", r#"["seccomp"]"#)
        .env("SNAKECAGE_SANDBOX__LAYERS_OFF", r#"["seccomp"]"#)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sandbox layer seccomp is both required and switched off"),
        "{stderr}"
    );
}

#[tokio::test]
async fn everything_the_allowlist_promises_works_inside_a_hardened_worker() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)).await;
    let names: Vec<String> = snakecage_worker::allowlist::stdlib_allowlist()
        .iter()
        .map(|m| format!("{:?}", m.name))
        .collect();
    let code = format!(
        "failed = []\nfor name in [{}]:\n    try:\n        __import__(name)\n    except Exception as e:\n        failed.append(f'{{name}}: {{e!r}}')\nprint(failed)",
        names.join(", ")
    );
    let r = s.run(&code).await;
    assert_eq!(r["stdout"], "[]\n", "{r}");

    // What a data-analysis job does: third-party packages, lazily loaded extension
    // modules (shared libraries from /usr/lib), time zones, temp files, a saved figure.
    let job = "import numpy as np, pandas as pd, scipy.stats, PIL.Image, openpyxl\nimport matplotlib.pyplot as plt\nimport sqlite3, lzma, bz2, zoneinfo, tempfile, datetime, copy, decimal, os\nplt.plot(np.arange(5))\nplt.savefig('fig.png')\ndb = sqlite3.connect(':memory:')\ndb.execute('create table t (x)')\nwith tempfile.NamedTemporaryFile() as f:\n    f.write(b'x')\ndf = pd.DataFrame({'a': [1, 2]})\ndf.to_excel('t.xlsx')\nprint(os.path.getsize('fig.png') > 0, len(lzma.compress(b'x')) > 0, zoneinfo.ZoneInfo('Europe/Paris').key, datetime.datetime.strptime('2024', '%Y').year, copy.deepcopy({'k': [1]}), round(float(scipy.stats.norm.cdf(0)), 2), open(os.path.abspath('t.xlsx'), 'rb').read(2))";
    // scipy and openpyxl are not preloaded: importing them takes a while on a busy machine.
    let r = s.run_with(json!({"code": job, "timeout_ms": 30_000})).await;
    assert_eq!(
        r["stdout"], "True True Europe/Paris 2024 {'k': [1]} 0.5 b'PK'\n",
        "{r}"
    );
}

/// User code may import its own modules from the workspace, as `python __main__.py` can;
/// that must never become a way to reach a real module the allowlist denies.
#[tokio::test]
async fn own_workspace_modules_import_but_cannot_stand_in_for_denied_ones() {
    let s =
        Server::start_with(Options::default().env("SNAKECAGE_SANDBOX__REQUIRE", ALL_LAYERS)).await;

    // A helper module written next to the code imports.
    let r = s.run("open('helper.py', 'w').write('def twice(x):\\n    return 2 * x\\n')\nimport helper\nprint(helper.twice(21))").await;
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(0), json!("42\n")),
        "{r}"
    );

    // A file named like a denied module is the user's file, or denied: never the real one.
    let r = s
        .run("open('subprocess.py', 'w').write('MARK = 1\\n')\nimport subprocess\nprint(hasattr(subprocess, 'MARK'), hasattr(subprocess, 'Popen'))")
        .await;
    let stdout = r["stdout"].as_str().unwrap();
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stdout == "True False\n"
            || stderr
                .contains("ImportError: import of 'subprocess' is not allowed in this sandbox"),
        "{r}"
    );
    assert!(
        !stdout.contains("True True") && !stdout.contains("False True"),
        "the real subprocess was reached: {r}"
    );

    // A namespace directory does not count: the finder would go on to the real module.
    let r = s.run("import os\nos.mkdir('socket')\nimport socket").await;
    assert_eq!(r["exit_code"], 1, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("ImportError: import of 'socket' is not allowed in this sandbox"),
        "{r}"
    );

    // A module outside the workspace on sys.path does not count either.
    let r = s
        .run("import sys\nsys.path.insert(0, '/usr/lib/python3/dist-packages')\nimport smtplib")
        .await;
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("ImportError: import of 'smtplib' is not allowed in this sandbox"),
        "{r}"
    );
}
