"""Tests for worker/python/runner.py: one job's life in the zygote's interpreter.

The runner is loaded the way the Rust worker loads it (see ``runner_modules.py``):
``runner.py`` compiled under the name ``snakecage/runner.py`` and executed into a
fresh module named ``_snakecage_runner``, after the modules it imports. What only
shows in a forked child with ``site`` disabled is in ``test_runner_child.py``; the
stdlib allowlist's own checks are in ``test_allowlist.py``.
"""

import builtins
import linecache
import re
import sys
import textwrap
import types

import pytest

from runner_modules import ASYNCIO_WARM_UP, OK, RUNNER_FILES, error, job


def runner_frames_in(text):
    """Names of the runner's files that a traceback in ``text`` shows frames of."""
    return [path.name for path in RUNNER_FILES if path.name in text]


# --------------------------------------------------------------------------
# Basics


def test_hello_world(runner, capsys):
    result = runner.run(job('print("hello, world")'))
    assert result == OK
    assert capsys.readouterr() == ("hello, world\n", "")


def test_result_has_exactly_the_documented_keys(runner, capsys):
    assert set(runner.run(job("pass"))) == {"exit_code", "memory_error", "error", "results"}
    assert set(runner.run(job("1/0"))["error"]) == {"type", "message"}


def test_empty_code_succeeds(runner, capsys):
    assert runner.run(job("", interactive=True)) == OK
    assert capsys.readouterr() == ("", "")


def test_code_must_be_a_string(runner):
    with pytest.raises(TypeError):
        runner.run(job(b"print(1)"))


# --------------------------------------------------------------------------
# last_line_interactive


@pytest.mark.parametrize(
    "code, shown",
    [
        ("1 + 1\n2 + 2", "4\n"),
        ("x = 1", ""),
        ("print(3)", "3\n"),
        ("total = 0\nfor i in range(4):\n    total += i\ntotal\n", "6\n"),
        ("x = 5\nx  # the answer\n# trailing comment\n", "5\n"),
        ("'text'", "'text'\n"),
        ("None", ""),
        ("[i * i for i in range(3)]", "[0, 1, 4]\n"),
        ("def f():\n    return 7\nf()\n\n\n", "7\n"),
        ("if True:\n    8", ""),  # only a top-level expression is shown
        # As in Jupyter, a trailing ';' runs the expression without showing it.
        ("x = 5\nx;", ""),
        ("x = 5\nx ;  # quiet\n", ""),
        ("'é' + 'ü';", ""),
        ("(1,\r\n 2);\r\n", ""),
        ("print(9);", "9\n"),
        ("x = 5\nx  # not quiet;\n", "5\n"),
        ("x = 5; x", "5\n"),
        ("s = 'a;'\ns", "'a;'\n"),
    ],
)
def test_last_line_interactive_displays_trailing_expression(runner, capsys, code, shown):
    bundles = [{"text/plain": shown[:-1]}] if shown and "print" not in code else []
    assert runner.run(job(code, interactive=True)) == dict(OK, results=bundles)
    assert capsys.readouterr() == (shown, "")


def test_nothing_is_displayed_when_not_interactive(runner, capsys):
    assert runner.run(job("1 + 1\n2 + 2", interactive=False)) == OK
    assert capsys.readouterr() == ("", "")


def test_display_sets_underscore_like_the_repl(runner, capsys, monkeypatch):
    monkeypatch.setattr(builtins, "_", None, raising=False)
    runner.run(job("6 * 7", interactive=True))
    assert builtins._ == 42


def test_display_keeps_future_imports_of_the_body(runner, capsys):
    code = "from __future__ import annotations\ndef f(x: Undefined) -> None: pass\nf.__annotations__\n"
    assert runner.run(job(code, interactive=True))["exit_code"] == 0
    assert capsys.readouterr().out == "{'x': 'Undefined', 'return': 'None'}\n"


def test_error_in_displayed_expression_points_at_its_line(runner, capsys):
    result = runner.run(job("x = 0\n1 / x", interactive=True))
    assert result == error("ZeroDivisionError", "division by zero")
    err = capsys.readouterr().err
    assert 'File "__main__.py", line 2, in <module>\n    1 / x\n' in err


# --------------------------------------------------------------------------
# Uncaught exceptions


def test_exception_gives_exit_code_1_and_trimmed_traceback(runner, capsys):
    code = "def divide(a, b):\n    return a / b\n\ndivide(1, 0)\n"
    result = runner.run(job(code))
    assert result == error("ZeroDivisionError", "division by zero")
    out, err = capsys.readouterr()
    assert out == ""
    assert not runner_frames_in(err)
    assert err == (
        "Traceback (most recent call last):\n"
        '  File "__main__.py", line 4, in <module>\n'
        "    divide(1, 0)\n"
        '  File "__main__.py", line 2, in divide\n'
        "    return a / b\n"
        "           ~~^~~\n"
        "ZeroDivisionError: division by zero\n"
    )


def test_chained_exceptions_are_all_printed(runner, capsys):
    code = textwrap.dedent(
        """\
        try:
            {}["missing"]
        except KeyError as exc:
            raise ValueError("bad key") from exc
        """
    )
    assert runner.run(job(code)) == error("ValueError", "bad key")
    err = capsys.readouterr().err
    assert not runner_frames_in(err)
    assert err.count("Traceback (most recent call last):") == 2
    assert "KeyError: 'missing'\n" in err
    assert "\nThe above exception was the direct cause of the following exception:\n\n" in err
    assert err.endswith('    raise ValueError("bad key") from exc\nValueError: bad key\n')


def test_frames_inside_libraries_stay_in_the_traceback(runner, capsys):
    assert runner.run(job("import json\njson.loads('{')"))["exit_code"] == 1
    err = capsys.readouterr().err
    assert 'File "__main__.py", line 2, in <module>' in err
    assert re.search(r'File ".*json[/\\]decoder\.py", line \d+, in raw_decode', err)
    assert not runner_frames_in(err)


def test_user_defined_exception_is_named_without_module(runner, capsys):
    code = "class Oops(Exception):\n    pass\nraise Oops('custom')\n"
    assert runner.run(job(code)) == error("Oops", "custom")
    assert capsys.readouterr().err.endswith("\nOops: custom\n")


def test_a_huge_exception_message_is_cut_in_the_error_entry_not_on_stderr(runner, capsys):
    # 70 MB of message would make the result frame too large to send; the entry is cut
    # and marked, the traceback on stderr keeps it whole (stderr has its own limit).
    code = "class " + "É" * 300 + "(Exception):\n    pass\nraise " + "É" * 300 + "('ü' * 10**6)\n"
    result = runner.run(job(code))
    mark = "\n...[truncated]"
    assert result["error"]["type"] == "É" * 256 + mark
    assert result["error"]["message"] == "ü" * 8192 + mark
    assert capsys.readouterr().err.endswith("É" * 300 + ": " + "ü" * 10**6 + "\n")


def test_an_exception_message_at_the_bound_is_whole(runner, capsys):
    assert runner.run(job("raise ValueError('x' * 8192)")) == error("ValueError", "x" * 8192)

def test_keyboard_interrupt_gives_exit_code_1_with_traceback(runner, capsys):
    result = runner.run(job("raise KeyboardInterrupt"))
    assert result == error("KeyboardInterrupt", "")
    assert capsys.readouterr().err == (
        "Traceback (most recent call last):\n"
        '  File "__main__.py", line 1, in <module>\n'
        "    raise KeyboardInterrupt\n"
        "KeyboardInterrupt\n"
    )


def test_user_excepthook_is_called_like_cpython_does(runner, capsys, monkeypatch):
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    code = textwrap.dedent(
        """\
        import sys
        def hook(kind, value, tb):
            print("hooked", kind.__name__, tb.tb_frame.f_code.co_filename, file=sys.stderr)
        sys.excepthook = hook
        1 / 0
        """
    )
    assert runner.run(job(code))["exit_code"] == 1
    assert capsys.readouterr().err == "hooked ZeroDivisionError __main__.py\n"


def test_traceback_quotes_the_job_not_a_main_file_on_disk(runner, capsys, monkeypatch, tmp_path):
    (tmp_path / "__main__.py").write_text("WRONG = 'a file on disk'\n" * 3)
    monkeypatch.chdir(tmp_path)
    runner.run(job("x = 1\ny = x / 0\n"))
    runner.run(job("z = (\n"))
    err = capsys.readouterr().err
    assert "WRONG" not in err
    assert "    y = x / 0\n" in err
    assert "    z = (\n" in err


def test_traceback_shows_source_even_if_user_clears_linecache(runner, capsys):
    runner.run(job("import linecache\nlinecache.clearcache()\n1 / 0\n"))
    assert '  File "__main__.py", line 3, in <module>\n    1 / 0\n' in capsys.readouterr().err


def test_broken_stderr_still_reports_on_fd_2(runner, capfd, monkeypatch):
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    result = runner.run(job("import sys\nsys.stderr = None\n1 / 0\n"))
    assert result == error("ZeroDivisionError", "division by zero")
    assert "ZeroDivisionError: division by zero" in capfd.readouterr().err


# --------------------------------------------------------------------------
# Syntax errors


def test_syntax_error_is_reported_like_cpython(runner, capsys):
    result = runner.run(job("x = (\n", interactive=True))
    assert result == error("SyntaxError", "'(' was never closed")
    assert capsys.readouterr() == (
        "",
        '  File "__main__.py", line 1\n'
        "    x = (\n"
        "        ^\n"
        "SyntaxError: '(' was never closed\n",
    )


def test_indentation_error_gets_a_single_caret(runner, capsys):
    result = runner.run(job("if True:\nprint(1)\n"))
    assert result["error"]["type"] == "IndentationError"
    assert capsys.readouterr().err == (
        '  File "__main__.py", line 2\n'
        "    print(1)\n"
        "    ^\n"
        "IndentationError: expected an indented block after 'if' statement on line 1\n"
    )


def test_compile_stage_syntax_error_has_no_traceback(runner, capsys):
    result = runner.run(job("print('before')\nreturn 5\n"))
    assert result == error("SyntaxError", "'return' outside function")
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran
    assert err == '  File "__main__.py", line 2\n    return 5\n    ^^^^^^^^\nSyntaxError: \'return\' outside function\n'


def test_null_byte_is_a_syntax_error(runner, capsys):
    result = runner.run(job("x = 1\ny = 2\x00\n"))
    assert result == error("SyntaxError", "source code cannot contain null bytes")
    assert capsys.readouterr().err == (
        '  File "__main__.py", line 2\n    y = 2\nSyntaxError: source code cannot contain null bytes\n'
    )


# --------------------------------------------------------------------------
# SystemExit


@pytest.mark.parametrize(
    "code, exit_code, err",
    [
        ("import sys\nsys.exit(3)", 3, ""),
        ("import sys\nsys.exit(None)", 0, ""),
        ("import sys\nsys.exit()", 0, ""),
        ("raise SystemExit", 0, ""),
        ("raise SystemExit(7)", 7, ""),
        ("import sys\nsys.exit(True)", 1, ""),
        ("import sys\nsys.exit('msg')", 1, "msg\n"),
        ("raise SystemExit(1, 2)", 1, "(1, 2)\n"),
        # What the process's exit status would be under `python __main__.py`.
        ("import sys\nsys.exit(256)", 0, ""),
        ("import sys\nsys.exit(-1)", 255, ""),
        ("import sys\nsys.exit(2**70)", 255, ""),
    ],
)
def test_system_exit(runner, capsys, code, exit_code, err):
    assert runner.run(job(code)) == dict(OK, exit_code=exit_code)
    assert capsys.readouterr() == ("", err)


def test_system_exit_runs_no_further_code(runner, capsys):
    assert runner.run(job("import sys\nprint('a')\nsys.exit(2)\nprint('b')"))["exit_code"] == 2
    assert capsys.readouterr().out == "a\n"


# --------------------------------------------------------------------------
# stdin, __main__, argv


def test_input_reads_from_job_stdin(runner, capsys):
    code = "name = input()\nage = int(input('age? '))\nprint(f'{name} is {age}')"
    assert runner.run(job(code, stdin="Ada\n36\n")) == OK
    assert capsys.readouterr().out == "age? Ada is 36\n"


def test_stdin_none_is_empty(runner, capsys):
    assert runner.run(job("import sys\nprint(repr(sys.stdin.read()))", stdin=None)) == OK
    assert capsys.readouterr().out == "''\n"
    assert runner.run(job("input()"))["error"] == {"type": "EOFError", "message": "EOF when reading a line"}


def test_stdin_has_a_binary_buffer_like_the_real_one(runner, capsys):
    assert runner.run(job("import sys\nprint(sys.stdin.buffer.read())", stdin="é\r\n")) == OK
    assert capsys.readouterr().out == "b'\\xc3\\xa9\\r\\n'\n"


def test_std_streams_and_main_are_restored_after_run(runner, capsys):
    before = (sys.stdin, sys.modules.get("__main__"), list(sys.argv))
    runner.run(job("import sys\nprint(sys.argv)\nx = input()", stdin="data"))
    assert (sys.stdin, sys.modules.get("__main__"), sys.argv) == before
    assert capsys.readouterr().out == "['__main__.py']\n"


def test_code_runs_as_main_module(runner, capsys):
    code = textwrap.dedent(
        """\
        import sys
        if __name__ == "__main__":
            print("main", __file__)
        print(sys.modules["__main__"].__dict__ is globals())
        print(__builtins__ is __import__("builtins"))
        """
    )
    assert runner.run(job(code)) == OK
    assert capsys.readouterr().out == "main __main__.py\nTrue\nTrue\n"


def test_dataclass_and_pickle_of_user_classes(runner, capsys):
    code = textwrap.dedent(
        """\
        import dataclasses, pickle

        @dataclasses.dataclass
        class Point:
            x: int
            y: int = 0

        class Box:
            def __init__(self, item):
                self.item = item

        p = Point(1, 2)
        box = pickle.loads(pickle.dumps(Box(p)))
        print(p, box.item == p, type(box).__module__)
        """
    )
    assert runner.run(job(code)) == OK
    assert capsys.readouterr().out == "Point(x=1, y=2) True __main__\n"


def test_inspect_getsource_finds_user_functions(runner, capsys):
    code = "import inspect\ndef twice(x):\n    return 2 * x\nprint(inspect.getsource(twice), end='')"
    assert runner.run(job(code)) == OK
    assert capsys.readouterr().out == "def twice(x):\n    return 2 * x\n"


def test_globals_are_isolated_between_runs(runner, capsys):
    assert runner.run(job("secret = 42")) == OK
    result = runner.run(job("print(secret)"))
    assert result == error("NameError", "name 'secret' is not defined")


def test_one_shot_run_waits_for_threads_it_started(runner, capsys):
    code = textwrap.dedent(
        """\
        import threading, time
        def late():
            time.sleep(0.2)
            print("thread done")
        threading.Thread(target=late).start()
        print("main done")
        """
    )
    assert runner.run(job(code)) == OK
    assert capsys.readouterr().out == "main done\nthread done\n"


# --------------------------------------------------------------------------
# MemoryError


def test_memory_error_is_flagged(runner, capsys):
    result = runner.run(job("data = bytearray(2**62)"))
    assert result == dict(OK, exit_code=1, memory_error=True, error={"type": "MemoryError", "message": ""})
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.endswith("    data = bytearray(2**62)\n           ^^^^^^^^^^^^^^^^\nMemoryError\n")


def test_source_too_deep_to_parse_is_an_error_not_the_memory_budget(runner, capsys):
    result = runner.run(job("x = " + "-" * 100_000 + "1"))
    assert result["exit_code"] == 1
    assert result["memory_error"] is False
    assert result["error"]["type"] == "MemoryError"
    assert result["error"]["message"].startswith("Parser stack overflowed")
    assert "Parser stack overflowed" in capsys.readouterr().err


def test_memory_error_subclass_is_flagged(runner, capsys):
    code = "class Huge(MemoryError):\n    pass\nraise Huge('too big')"
    assert runner.run(job(code))["memory_error"] is True


def test_numpy_memory_error_is_flagged(runner, capsys):
    pytest.importorskip("numpy")
    result = runner.run(job("import numpy as np\nnp.empty(2**50, dtype=np.uint8)"))
    assert result["exit_code"] == 1
    assert result["memory_error"] is True
    assert "Unable to allocate" in capsys.readouterr().err


def test_other_exceptions_are_not_memory_errors(runner, capsys):
    assert runner.run(job("raise ValueError('x')"))["memory_error"] is False


def test_failure_while_formatting_falls_back_to_one_line(runner, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError

    broken = types.SimpleNamespace(TracebackException=no_memory, clear_frames=lambda tb: None)
    monkeypatch.setattr(runner._report, "traceback", broken)
    result = runner.run(job("data = bytearray(2**62)"))
    assert result["memory_error"] is True
    assert capsys.readouterr().err == "MemoryError\n"


# --------------------------------------------------------------------------
# Session


def test_session_keeps_globals_between_runs(runner, capsys):
    session = runner.Session()
    assert session.run(job("x = 41\ndef inc(v):\n    return v + 1")) == OK
    assert session.run(job("inc(x)", interactive=True)) == dict(OK, results=[{"text/plain": "42"}])
    assert capsys.readouterr().out == "42\n"


def test_session_errors_do_not_lose_state(runner, capsys):
    session = runner.Session()
    session.run(job("items = [1]"))
    assert session.run(job("items.append(2)\n1 / 0"))["exit_code"] == 1
    session.run(job("print(items)"))
    assert capsys.readouterr().out == "[1, 2]\n"


def test_session_reset_clears_user_globals(runner, capsys):
    session = runner.Session()
    session.run(job("x = 1"))
    session.reset()
    assert session.run(job("x")) == error("NameError", "name 'x' is not defined")
    assert session.run(job("print(__name__)")) == OK
    assert capsys.readouterr().out == "__main__\n"


def test_sessions_are_independent(runner, capsys):
    first, second = runner.Session(), runner.Session()
    first.run(job("x = 'first'"))
    assert second.run(job("x"))["exit_code"] == 1


# --------------------------------------------------------------------------
# warm_up


@pytest.mark.parametrize("had_entries", [True, False])
def test_warm_up_leaves_no_trace(runner, capfd, monkeypatch, had_entries):
    sentinel_main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", sentinel_main)
    if had_entries:
        underscore = object()
        monkeypatch.setattr(builtins, "_", underscore, raising=False)
        entry = (1, None, ["x\n"], "__main__.py")
        monkeypatch.setitem(linecache.cache, "__main__.py", entry)
    else:
        monkeypatch.delattr(builtins, "_", raising=False)
        monkeypatch.delitem(linecache.cache, "__main__.py", raising=False)
    streams = (sys.stdout, sys.stderr, sys.stdin)
    argv = sys.argv

    runner.warm_up(ASYNCIO_WARM_UP)

    assert (sys.stdout, sys.stderr, sys.stdin) == streams
    assert sys.argv is argv
    assert sys.modules["__main__"] is sentinel_main
    if had_entries:
        assert builtins._ is underscore
        assert linecache.cache["__main__.py"] is entry
    else:
        assert not hasattr(builtins, "_")
        assert "__main__.py" not in linecache.cache
    assert capfd.readouterr() == ("", "")


# --------------------------------------------------------------------------
# Top-level await


@pytest.fixture
def python_sigint():
    """SIGINT raising KeyboardInterrupt, as every worker has it (``prepare_zygote``): a
    test run started in the background by a non-interactive shell inherits it ignored."""
    import signal

    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


def test_top_level_await_runs_and_shows_the_last_expression(runner, capsys):
    code = "import asyncio\nawait asyncio.sleep(0)\nprint('après')\nawait asyncio.sleep(0, 6 * 7)"
    result = runner.run(job(code, interactive=True))
    assert result == {**OK, "results": [{"text/plain": "42"}]}
    assert capsys.readouterr() == ("après\n42\n", "")


def test_code_without_await_is_not_run_on_a_loop(runner, capsys):
    # asyncio.run inside sync code needs no running loop around it.
    code = "import asyncio\nprint(asyncio.run(asyncio.sleep(0, 'run')))"
    assert runner.run(job(code)) == OK
    assert capsys.readouterr().out == "run\n"


def test_an_awaited_exception_shows_only_the_jobs_frames(runner, capsys):
    code = "import asyncio\nasync def f():\n    raise ValueError('échec')\nawait f()"
    assert runner.run(job(code)) == error("ValueError", "échec")
    assert capsys.readouterr().err == (
        "Traceback (most recent call last):\n"
        '  File "__main__.py", line 4, in <module>\n'
        "    await f()\n"
        '  File "__main__.py", line 3, in f\n'
        "    raise ValueError('échec')\n"
        "ValueError: échec\n"
    )


def test_a_one_shot_job_cancels_the_tasks_it_leaves(runner, capsys):
    code = (
        "import asyncio\n"
        "async def background():\n"
        "    try:\n"
        "        await asyncio.sleep(3600)\n"
        "    finally:\n"
        "        print('cancelled')\n"
        "task = asyncio.ensure_future(background())\n"
        "await asyncio.sleep(0)\n"
        "print('end')\n"
    )
    assert runner.run(job(code)) == OK
    assert capsys.readouterr().out == "end\ncancelled\n"


def test_an_interrupted_await_reads_like_an_interrupt_of_sync_code(runner, capsys, python_sigint):
    # The supervisor's SIGINT, sent while the job awaits: the coroutine is cancelled (its
    # finally runs) and the job ends with KeyboardInterrupt at the await.
    code = (
        "import asyncio, os\n"
        "asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), 2)\n"
        "try:\n"
        "    await asyncio.sleep(30)\n"
        "finally:\n"
        "    print('cleanup')\n"
    )
    assert runner.run(job(code)) == error("KeyboardInterrupt", "")
    out, err = capsys.readouterr()
    assert out == "cleanup\n"
    assert err.startswith(
        "Traceback (most recent call last):\n"
        '  File "__main__.py", line 4, in <module>\n'
        "    await asyncio.sleep(30)\n"
    ), err
    assert err.endswith("\nKeyboardInterrupt\n"), err
    assert "CancelledError" not in err, err


def test_a_session_keeps_its_loop_and_a_reset_cancels_its_tasks(runner, capsys):
    session = runner.Session()
    start = (
        "import asyncio\n"
        "stopped = []\n"
        "async def wait():\n"
        "    try:\n"
        "        return await queue.get()\n"
        "    finally:\n"
        "        stopped.append(True)\n"
        "queue = asyncio.Queue()\n"
        "waiter = asyncio.create_task(wait())\n"
        "await asyncio.sleep(0)\n"
    )
    assert session.run(job(start)) == OK
    assert session.run(job("queue.put_nowait('é')\nawait waiter", interactive=True)) == {
        **OK,
        "results": [{"text/plain": "'é'"}],
    }
    assert session.run(job("waiter = asyncio.create_task(wait())\nawait asyncio.sleep(0)")) == OK
    kept = session._module.__dict__["stopped"]
    assert kept == [True]
    session.reset()
    assert kept == [True, True]
    capsys.readouterr()


def test_an_entrypoint_may_not_await_at_top_level(runner, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "main.py").write_text("import asyncio\nawait asyncio.sleep(0)\n", encoding="utf-8")
    result = runner.run({"entrypoint": "main.py", "stdin": None, "last_line_interactive": False})
    assert result["error"] == {"type": "SyntaxError", "message": "'await' outside function"}


@pytest.mark.parametrize(
    "ending, code, exit_code",
    [
        ("a task's SystemExit", "async def stop():\n    sys.exit(3)\nasyncio.create_task(stop())\n", 3),
        ("the loop stopped", "asyncio.get_running_loop().stop()\n", 1),
    ],
)
def test_a_session_job_that_ends_early_does_not_run_on_in_later_jobs(runner, capsys, ending, code, exit_code):
    session = runner.Session()
    job_code = "import asyncio, sys\n" + code + "await asyncio.sleep(0.1)\nprint('rest of the job')\nflag = 1\n"
    assert session.run(job(job_code))["exit_code"] == exit_code, ending
    capsys.readouterr()
    later = session.run(job("await asyncio.sleep(0.2)\nprint('flag' in globals(), len(asyncio.all_tasks()))"))
    assert later == OK
    assert capsys.readouterr().out == "False 1\n", ending


def test_an_async_job_leaves_asyncio_as_a_fresh_process_has_it(runner, capsys, recwarn):
    # asyncio.Runner sets and unsets the thread's loop; after that, get_event_loop()
    # refuses to make one. A job after a warm-up's loop must still get one.
    assert runner.run(job("import asyncio\nawait asyncio.sleep(0)")) == OK
    code = "import asyncio\nloop = asyncio.get_event_loop()\nprint(loop.run_until_complete(asyncio.sleep(0, 'ok')))\nloop.close()"
    assert runner.run(job(code)) == OK
    assert capsys.readouterr().out == "ok\n"


def test_what_cancelled_tasks_print_during_a_reset_goes_nowhere(runner, capsys):
    session = runner.Session()
    code = (
        "import asyncio\n"
        "async def worker():\n"
        "    try:\n"
        "        await asyncio.sleep(3600)\n"
        "    finally:\n"
        "        print('worker stopped')\n"
        "task = asyncio.create_task(worker())\n"
        "await asyncio.sleep(0)\n"
    )
    assert session.run(job(code)) == OK
    session.reset()
    assert capsys.readouterr() == ("", "")
    assert session.run(job("print(1 + 1)")) == OK
    assert capsys.readouterr().out == "2\n"


def _interrupts(n):
    """The supervisor's interrupt of an overdue session job: SIGINT, then again every 250 ms
    of its grace period (here ``n``, 30 ms apart, from a thread of the job: exactly as many
    as the job takes, since one more would land in the test run)."""
    return (
        "import os, threading, time\n"
        "def _interrupt():\n"
        f"    for _ in range({n}):\n"
        "        time.sleep(0.03)\n"
        "        os.kill(os.getpid(), 2)\n"
        "threading.Thread(target=_interrupt, daemon=True).start()\n"
    )


def test_an_interrupt_with_no_frame_of_the_job_shows_no_loop_frames(runner, capsys, python_sigint):
    # A coroutine that ignores its cancellation: the second SIGINT raises in asyncio's own
    # handler, with no frame of the job's on the stack; the third ends the unwinding.
    code = _interrupts(3) + (
        "import asyncio\n"
        "async def stubborn():\n"
        "    while True:\n"
        "        try:\n"
        "            await asyncio.sleep(10)\n"
        "        except asyncio.CancelledError:\n"
        "            pass\n"
        "await stubborn()\n"
    )
    # A session's job (only those are interrupted); a one-shot job's end would cancel the
    # stubborn task forever, which the supervisor's kill at the deadline settles.
    assert runner.Session().run(job(code)) == error("KeyboardInterrupt", "")
    assert capsys.readouterr().err == "KeyboardInterrupt\n"


def test_a_second_interrupt_in_the_jobs_code_shows_where_without_asyncios_handler(runner, capsys, python_sigint):
    code = _interrupts(2) + (
        "import asyncio\n"
        "async def stubborn():\n"
        "    try:\n"
        "        await asyncio.sleep(10)\n"
        "    except asyncio.CancelledError:\n"
        "        while True:\n"
        "            time.sleep(0.001)\n"
        "await stubborn()\n"
    )
    assert runner.Session().run(job(code)) == error("KeyboardInterrupt", "")
    err = capsys.readouterr().err
    assert err.endswith(
        '  File "__main__.py", line 13, in stubborn\n'
        "    time.sleep(0.001)\n"
        "KeyboardInterrupt\n"
    ), err
    assert "runners.py" not in err, err
