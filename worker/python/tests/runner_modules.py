"""Loads the runner's modules as the zygote does (worker/src/interpreter.rs, ``RUNNER_MODULES``),
and what the runner's tests share: the interpreter, a job, the results they expect.

Each ``worker/python/<name>.py`` is executed into a fresh module named
``_snakecage_<name>`` with its code objects named ``snakecage/<name>.py``; the
ones the runner imports are registered in ``sys.modules`` first, in order.
"""

import sys
import types
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]
IMPORTED_BY_RUNNER = ("alarm", "aio", "display", "variables", "report", "program", "files", "state")
"""The modules ``runner.py`` imports, in load order (each imports only those before it)."""

RUNNER_FILES = [PYTHON_DIR / f"{name}.py" for name in (*IMPORTED_BY_RUNNER, "runner")]
"""Every file of the runner, in load order, the runner last."""

ASYNCIO_WARM_UP = (PYTHON_DIR / "warmup_asyncio.py").read_text(encoding="utf-8")
"""The async tier's warm-up, which ``warm_up`` also runs in a zygote that preloads asyncio."""


def load_module(name):
    """``worker/python/<name>.py`` as the module ``_snakecage_<name>`` (not registered)."""
    module = types.ModuleType(f"_snakecage_{name}")
    source = (PYTHON_DIR / f"{name}.py").read_text(encoding="utf-8")
    exec(compile(source, f"snakecage/{name}.py", "exec"), module.__dict__)
    return module


def load_runner():
    """A fresh runner, with fresh copies of the modules it imports in ``sys.modules``."""
    for name in IMPORTED_BY_RUNNER:
        sys.modules[f"_snakecage_{name}"] = load_module(name)
    return load_module("runner")


CHILD_LOADER = """\
import sys, types
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1][:-3]
    module = types.ModuleType("_snakecage_" + name)
    exec(compile(open(path, encoding="utf-8").read(), "snakecage/" + name + ".py", "exec"), module.__dict__)
    if name != "runner":
        sys.modules[module.__name__] = module
runner = module
"""
"""``load_runner`` for a ``python -S -c`` child, which is given ``RUNNER_FILES`` as arguments
and must import nothing else."""


REPO_ROOT = Path(__file__).resolve().parents[3]
PYENV_PYTHON = Path("/root/.pyenv/versions/3.12.1/bin/python3.12")
# The service's CPython; the venv's interpreter is the same build.
CPYTHON = str(PYENV_PYTHON) if PYENV_PYTHON.exists() else sys.executable
# The venv's site-packages, for the tests that need numpy (this process runs in the venv).
SITE_PACKAGES = next(Path(p) for p in sys.path if p.endswith("site-packages"))

OK = {"exit_code": 0, "memory_error": False, "error": None, "results": []}


def job(code, stdin=None, interactive=False):
    return {"code": code, "stdin": stdin, "last_line_interactive": interactive}


def error(type_name, message):
    return {
        "exit_code": 1,
        "memory_error": False,
        "error": {"type": type_name, "message": message},
        "results": [],
    }
