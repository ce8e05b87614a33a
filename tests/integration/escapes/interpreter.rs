//! Interpreter-level attacks: native code through ctypes, introspection that hunts for
//! objects and frames, tracing, replacing the hooks, the environment (`LD_PRELOAD`).

use super::fixture::{Fixture, audit, denied, import_denied, prints};

/// Stopped by the audit hook and the import guard (the OS layers stop what gets past them:
/// see the raw syscalls in `syscalls.rs`).
pub(super) fn python_layer() -> Vec<Fixture> {
    vec![
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
    ]
}
