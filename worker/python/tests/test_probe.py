"""The rollover probe (``probe.py``): it imports every module named on stdin and reports
them; a module that raises on import fails it with that exception's traceback."""

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[1] / "probe.py"


def run(modules, path=None):
    env = {"PYTHONPATH": str(path)} if path else {}
    return subprocess.run(
        [sys.executable, "-I" if not path else "-S", str(PROBE)],
        input=json.dumps(modules),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_every_named_module_is_imported_and_reported():
    done = run(["json", "collections.abc"])
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["imported"] == ["json", "collections.abc"]
    assert report["python"] == sys.version.split()[0]


def test_nothing_named_is_a_pass():
    done = run([])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["imported"] == []


def test_a_module_that_raises_fails_the_probe_with_its_traceback(tmp_path):
    (tmp_path / "probe_boom.py").write_text("raise RuntimeError('probe_boom: ünïcode refuses')\n")
    done = run(["json", "probe_boom"], path=tmp_path)
    assert done.returncode != 0
    assert done.stderr.rstrip().splitlines()[-1] == "RuntimeError: probe_boom: ünïcode refuses"


def test_a_missing_module_fails_the_probe():
    done = run(["no_such_module_for_the_probe"])
    assert done.returncode != 0
    assert "ModuleNotFoundError: No module named 'no_such_module_for_the_probe'" in done.stderr
