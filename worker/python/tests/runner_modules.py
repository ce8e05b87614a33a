"""Loads the runner's modules as the zygote does (worker/src/interpreter.rs, ``RUNNER_MODULES``).

Each ``worker/python/<name>.py`` is executed into a fresh module named
``_snakecage_<name>`` with its code objects named ``snakecage/<name>.py``; the
ones the runner imports are registered in ``sys.modules`` first, in order.
"""

import sys
import types
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]
IMPORTED_BY_RUNNER = ("display", "report", "program", "state")
"""The modules ``runner.py`` imports, in load order (each imports only those before it)."""

RUNNER_FILES = [PYTHON_DIR / f"{name}.py" for name in (*IMPORTED_BY_RUNNER, "runner")]
"""Every file of the runner, in load order, the runner last."""


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
