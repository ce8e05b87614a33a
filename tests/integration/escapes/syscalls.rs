//! Raw syscalls through ctypes (x86_64 numbers): no Python-level check can see these, so
//! only seccomp stops them. Threads must still start.

use super::fixture::{Fixture, prints};

/// Empty on other architectures (the syscall numbers are x86_64's).
pub(super) fn os_layers() -> Vec<Fixture> {
    let mut fixtures = Vec::new();
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
