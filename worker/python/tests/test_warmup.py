"""The child warm-up jobs (``warmup_*.py``): each runs cleanly through the runner, and
together they leave nothing a user's job could observe: no output, no globals, no open
figure, no change to the random generators or the interpreter state the runner keeps."""

import builtins
import linecache
import random
import sys
import types
from pathlib import Path

import pytest

from runner_modules import load_runner

PYTHON_DIR = Path(__file__).resolve().parents[1]
WARM_UPS = ("python", "numpy", "pandas", "matplotlib", "asyncio")


def source(name):
    return (PYTHON_DIR / f"warmup_{name}.py").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def runner():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (preloaded, as in the plotting tier)

    return load_runner()


@pytest.mark.parametrize("name", WARM_UPS)
def test_each_warm_up_job_runs_cleanly_and_shows_its_result(runner, name, capsys):
    result = runner.run({"code": source(name), "stdin": None, "last_line_interactive": True})
    assert result["exit_code"] == 0, (result, capsys.readouterr())
    assert result["error"] is None
    out = capsys.readouterr().out
    if name == "matplotlib":
        # The figure left open is rendered to PNG, as a request's would be.
        assert any("image/png" in bundle for bundle in result["results"]), result["results"]
    else:
        assert out.strip(), "each job prints a result"
    if name == "pandas":
        assert out == "679.0\n"
    if name == "asyncio":
        assert out == "[0, 2, 4]\n"


def test_the_warm_up_leaves_no_trace_a_job_could_see(runner, capfd, monkeypatch):
    import numpy
    import matplotlib.pyplot as plt

    sentinel_main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", sentinel_main)
    monkeypatch.delattr(builtins, "_", raising=False)
    monkeypatch.delitem(linecache.cache, "__main__.py", raising=False)
    streams = (sys.stdout, sys.stderr, sys.stdin)
    random.seed(1234)
    numpy.random.seed(1234)
    python_state = random.getstate()
    numpy_state = numpy.random.get_state()
    builtin_names = set(vars(builtins))

    runner.warm_up_child([source(name) for name in WARM_UPS])

    assert (sys.stdout, sys.stderr, sys.stdin) == streams
    assert sys.modules["__main__"] is sentinel_main
    assert vars(sentinel_main) == {"__name__": "__main__", "__doc__": None, "__package__": None,
                                   "__loader__": None, "__spec__": None}
    assert set(vars(builtins)) == builtin_names
    assert "__main__.py" not in linecache.cache
    assert plt.get_fignums() == []
    assert random.getstate() == python_state
    after = numpy.random.get_state()
    assert after[0] == numpy_state[0] and (after[1] == numpy_state[1]).all() and after[2:] == numpy_state[2:]
    assert capfd.readouterr() == ("", "")
    # The next figure a job makes is figure 1, as in a process that never drew one.
    assert plt.figure().number == 1
    plt.close("all")
    # No event loop is left running or set: a job's asyncio.run() starts from scratch.
    import asyncio

    assert asyncio.events._get_running_loop() is None
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_no_warm_up_runs_nothing(runner, capfd):
    runner.warm_up_child([])
    assert capfd.readouterr() == ("", "")
