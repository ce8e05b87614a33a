"""Tests for worker/python/runner.py in a forked child as the embedded interpreter sees it
(``site`` disabled, a ``python -S`` subprocess), and its parity with ``python __main__.py``.
"""

import json
import os
import subprocess
import textwrap

import pytest

from runner_modules import CHILD_LOADER, CPYTHON, OK, RUNNER_FILES, SITE_PACKAGES, error, job

# --------------------------------------------------------------------------
# The forked child, as the embedded interpreter sees it (site disabled)

CHILD_PRELUDE = CHILD_LOADER + textwrap.dedent(
    """\
    import json

    def report(value):
        sys.__stdout__.write("RESULT " + json.dumps(value) + "\\n")
        sys.__stdout__.flush()
    """
)


def run_child(body):
    """Run ``body`` after loading the runner in a ``python -S`` process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run(
        [CPYTHON, "-S", "-c", CHILD_PRELUDE + textwrap.dedent(body), *map(str, RUNNER_FILES)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        timeout=60,
    )


def child_results(output):
    return [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")]


def test_child_streams_are_line_buffered_and_interleave(runner):
    proc = run_child(
        """\
        before = sys.stdout.line_buffering
        runner.prepare_zygote()
        runner.warm_up('')  # no asyncio in this interpreter
        runner.prepare_child()
        report([before, sys.stdout.line_buffering, sys.stderr.line_buffering])
        code = "import sys\\nprint('out 1')\\nprint('err 1', file=sys.stderr)\\nprint('out 2')\\n"
        report(runner.run({"code": code, "stdin": None, "last_line_interactive": False}))
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [[False, True, True], OK]
    assert "out 1\nerr 1\nout 2\n" in proc.stdout


def test_child_has_exit_and_quit_without_site(runner):
    proc = run_child(
        """\
        import builtins
        report(hasattr(builtins, "exit"))
        runner.prepare_zygote()
        report(runner.run({"code": "exit(4)", "stdin": None, "last_line_interactive": False}))
        report(runner.run({"code": "quit()", "stdin": None, "last_line_interactive": False}))
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [False, dict(OK, exit_code=4), OK]


def test_child_turns_sigint_into_keyboard_interrupt(runner):
    proc = run_child(
        """\
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as after Py_InitializeEx(0)
        runner.prepare_zygote()
        code = "import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(30)\\n"
        report(runner.run({"code": code, "stdin": None, "last_line_interactive": False}))
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [error("KeyboardInterrupt", "")]
    assert "KeyboardInterrupt" in proc.stdout


def test_child_warnings_quote_the_job_source(runner):
    # Checked outside pytest, which captures warnings itself.
    proc = run_child(
        """\
        code = "import warnings\\nwarnings.warn('careful')\\n"
        report(runner.run({"code": code, "stdin": None, "last_line_interactive": False}))
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [OK]
    assert "__main__.py:2: UserWarning: careful\n  warnings.warn('careful')\n" in proc.stdout


def test_forked_children_draw_different_random_numbers(runner):
    # Two children forked from one "zygote" whose generators were seeded alike:
    # CPython reseeds `random` after fork, prepare_child reseeds numpy's global one.
    proc = run_child(
        f"""\
        import os, random
        sys.path.append({str(SITE_PACKAGES)!r})
        import numpy
        random.seed(1234)
        numpy.random.seed(1234)
        draws = []
        for _ in range(2):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                runner.prepare_child()
                os.write(w, json.dumps([random.random(), float(numpy.random.random())]).encode())
                os._exit(0)
            os.close(w)
            draws.append(json.loads(os.read(r, 4096)))
            os.waitpid(pid, 0)
        report([draws[0][0] != draws[1][0], draws[0][1] != draws[1][1]])
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [[True, True]]


# --------------------------------------------------------------------------
# Parity with `python __main__.py` (what Onyx runs)

PARITY_CASES = [
    "print('hello')",
    "def f():\n    return 1 / 0\nf()",
    "import json\njson.loads('{')",
    "d = {'a': {'b': 1}}\nprint(d['a']['c'])",
    "x = None\nx.attr",
    "try:\n    1 / 0\nexcept Exception:\n    raise KeyError('k')",
    "raise ExceptionGroup('group', [ValueError(1), TypeError(2)])",
    "e = ValueError('n')\ne.add_note('a note')\nraise e",
    "class B(Exception):\n    def __str__(self):\n        raise RuntimeError\nraise B()",
    "assert 1 == 2, 'nope'",
    "data = bytearray(2**62)",
    "import sys\nsys.exit('bye')",
    "import sys\nsys.exit(300)",
    "x = (",
    "if True:\nprint(1)",
    "class A:\n  def f(self):\n\treturn 1\n        pass",
    "print 'x'",
    "f(**a, *b)",
    "x = 1\nbreak",
    "def f():\n    nonlocal q",
    "x = \"héllo\" +",
    "s = \"日本語\" ç",
    "x = \"\"\"abc\ndef",
    "print(f\"{x!z}\")",
    "x = {1: 2,\n     3}",
]


@pytest.mark.parametrize("code", PARITY_CASES)
def test_output_matches_python_running_main_py(runner, capsys, tmp_path, code):
    (tmp_path / "__main__.py").write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    real = subprocess.run(
        [CPYTHON, "__main__.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
    )
    # CPython shows the script's absolute path; the runner shows __main__.py.
    real_err = real.stderr.replace(str(tmp_path / "__main__.py"), "__main__.py")
    (tmp_path / "__main__.py").unlink()

    result = runner.run(job(code))
    out, err = capsys.readouterr()
    assert (result["exit_code"], out, err) == (real.returncode, real.stdout, real_err)


# --------------------------------------------------------------------------
# asyncio without sockets


def test_asyncio_imported_after_the_runner_wakes_its_loop_through_a_pipe():
    # The sandbox refuses every new socket; asyncio's loop used to make a socketpair.
    # Here asyncio is imported after the runner (a tier that does not preload it), so the
    # finder on sys.meta_path patches it as it loads.
    proc = run_child(
        """\
        import socket

        def refused(*args, **kwargs):
            raise PermissionError(1, "Operation not permitted")

        socket.socketpair = refused
        report("asyncio" in sys.modules)
        code = (
            "import asyncio, threading\\n"
            "async def main():\\n"
            "    loop = asyncio.get_running_loop()\\n"
            "    woken = loop.create_future()\\n"
            "    threading.Thread(target=loop.call_soon_threadsafe, args=(woken.set_result, 'é')).start()\\n"
            "    return await woken\\n"
            "print(asyncio.run(main()))\\n"
        )
        report(runner.run({"code": code, "stdin": None, "last_line_interactive": False}))
        report(type(asyncio_loop := sys.modules["asyncio"].new_event_loop()._ssock).__name__)
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [False, OK, "_PipeEnd"]
    assert "é\n" in proc.stdout


def test_asyncio_loaded_before_the_runner_is_patched_at_once():
    # A zygote loads the runner before its preloads, but install() also covers the other
    # order: an already loaded selector_events module is patched in place.
    proc = run_child(
        """\
        import types
        aio = sys.modules["_snakecage_aio"]
        loaded = types.ModuleType("asyncio.selector_events")
        loaded.BaseSelectorEventLoop = type("BaseSelectorEventLoop", (), {"_make_self_pipe": None})
        async def create_server(self):
            pass
        loaded.base_events = types.SimpleNamespace(BaseEventLoop=type("BaseEventLoop", (), {"create_server": create_server}))
        sys.modules["asyncio.selector_events"] = loaded
        aio.install()
        report(loaded.BaseSelectorEventLoop._make_self_pipe is aio._make_self_pipe)
        report(loaded.base_events.BaseEventLoop.create_server.snakecage_aio)
        report(sum(finder is aio._Finder for finder in sys.meta_path))
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [True, True, 1]


def test_one_shot_run_ends_with_an_executor_the_program_never_shut_down():
    # `python __main__.py` ends: interpreter shutdown tells the executor's idle
    # threads to stop before it joins them; so must the runner.
    proc = run_child(
        """\
        code = (
            "from concurrent.futures import ThreadPoolExecutor\\n"
            "pool = ThreadPoolExecutor(4)\\n"
            "print(list(pool.map(abs, [-1, -2, -3])))\\n"
        )
        report(runner.run({"code": code, "stdin": None, "last_line_interactive": False}))
        """
    )
    assert proc.returncode == 0, proc.stdout
    assert child_results(proc.stdout) == [OK]
    assert "[1, 2, 3]\n" in proc.stdout
