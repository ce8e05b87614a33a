//! Process attacks: creating processes (fork, exec, spawn, subprocess and the gadgets that
//! reach it), signalling other processes (the zygote, the supervisor), and privileges.

use super::fixture::{
    EPERM, Fixture, WORKER_GID, WORKER_UIDS, audit, denied, import_denied, prints,
};

/// Stopped by the audit hook and the import guard.
pub(super) fn python_layer(zygote_pid: i64) -> Vec<Fixture> {
    vec![
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
        denied(
            "asyncio subprocess (top-level await)",
            "import asyncio\nawait asyncio.create_subprocess_exec('id')",
            audit("subprocess.Popen"),
        ),
        denied(
            "asyncio shell (asyncio.run)",
            "import asyncio\nasyncio.run(asyncio.create_subprocess_shell('id'))",
            audit("subprocess.Popen"),
        ),
        denied(
            "os.fork through asyncio's executor",
            "import asyncio\nawait asyncio.get_running_loop().run_in_executor(None, asyncio.base_events.os.fork)",
            audit("os.fork"),
        ),
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
            format!(
                "import os\nprint({} <= os.getuid() <= {}, os.getgid(), os.getgroups(), 'HOST_API_TOKEN' in os.environ)",
                WORKER_UIDS.start(),
                WORKER_UIDS.end()
            ),
            format!("True {WORKER_GID} [] False\n"),
        ),
    ]
}

/// Stopped by seccomp, Landlock's signal scope and the uid drop.
pub(super) fn os_layers(supervisor_pid: u32) -> Vec<Fixture> {
    vec![
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
            "asyncio subprocess (seccomp)",
            "import asyncio\nawait asyncio.create_subprocess_exec('id')",
            EPERM,
        ),
        denied(
            "os.fork through asyncio's executor (seccomp)",
            "import asyncio\nawait asyncio.get_running_loop().run_in_executor(None, asyncio.base_events.os.fork)",
            EPERM,
        ),
        denied(
            "os.posix_spawn (seccomp)",
            "import os\nos.posix_spawn('/bin/id', ['id'], {})",
            format!("{EPERM}: '/bin/id'"),
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
        denied("setuid(0) after the drop", "import os\nos.setuid(0)", EPERM),
    ]
}
