"""Tests for ``python-stdlib-allowlist``: the one list of standard-library modules user code
may import, parsed with the rules the Rust side uses.
"""

import json
import re
import subprocess
import textwrap

from runner_modules import CPYTHON, REPO_ROOT

ALLOWLIST_PATH = REPO_ROOT / "python-stdlib-allowlist"

# --------------------------------------------------------------------------
# The stdlib allowlist

IDENTIFIER_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
NEVER_ALLOWED = {
    "subprocess", "socket", "ssl", "http", "urllib", "ftplib", "smtplib", "ctypes",
    "multiprocessing", "signal", "resource", "pty", "mmap", "importlib",
}


def allowlist_names():
    """Parse the allowlist with the rules the Rust side uses."""
    names = []
    for line in ALLOWLIST_PATH.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


def test_allowlist_entries_are_unique_dotted_identifiers():
    names = allowlist_names()
    assert len(names) > 50
    assert len(names) == len(set(names)), "duplicate entries"
    assert [n for n in names if not IDENTIFIER_PATH.match(n)] == []
    assert NEVER_ALLOWED.isdisjoint(names)


def test_allowlist_entries_have_a_reason():
    for line in ALLOWLIST_PATH.read_text(encoding="utf-8").splitlines():
        name, _, reason = line.partition("#")
        if name.strip():
            assert reason.strip(), f"no reason given for {name.strip()}"


def test_allowlist_entries_are_importable_stdlib_modules():
    names = allowlist_names()
    script = textwrap.dedent(
        """\
        import importlib, json, sys
        bad = []
        for name in json.loads(sys.argv[1]):
            if name.split(".")[0] not in sys.stdlib_module_names:
                bad.append(name + ": not in the standard library")
                continue
            try:
                importlib.import_module(name)
            except Exception as exc:
                bad.append(f"{name}: {exc!r}")
        print(json.dumps(bad))
        """
    )
    proc = subprocess.run(
        [CPYTHON, "-S", "-c", script, json.dumps(names)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
