//! Resource exhaustion: threads, file descriptors, file size, disk, recursion, a segfault.

use super::fixture::{Expect, Fixture, denied, prints};

/// Stopped by the rlimits, the deadline and CPython's own recursion limit; the worker
/// that crashes takes nothing else down.
pub(super) fn python_layer() -> Vec<Fixture> {
    vec![
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
        // 3.12 counts C-level recursion apart from the Python limit a job can raise.
        denied(
            "sys.setrecursionlimit(10**9) and C-level recursion",
            "import sys\nsys.setrecursionlimit(10**9)\nclass A:\n    def __repr__(self):\n        return repr(self)\nrepr(A())",
            "RecursionError: maximum recursion depth exceeded while calling a Python object",
        ),
        // ...but not through a million nested iterators: the C stack overflows.
        Fixture {
            name: "a million nested map() iterators (segfault)",
            code: "x = iter([1])\nfor _ in range(10**6):\n    x = map(abs, x)\nprint(next(x))".into(),
            timeout_ms: Some(10_000),
            expect: Expect::Killed,
        },
    ]
}
