"""Tests for running a workspace file as ``__main__`` (a job's ``entrypoint``).

The contract is ``python <entrypoint> <args...>`` run from the workspace:
``sys.argv``, ``__name__``, ``sys.path[0]``, tracebacks, exit status, and the
message for a file that is not there.
"""

import subprocess
import sys

import pytest

from runner_modules import CPYTHON


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def entry(path, *args, stdin=None):
    return {
        "code": "",
        "stdin": stdin,
        "last_line_interactive": True,
        "entrypoint": path,
        "args": list(args),
    }


def write(workspace, rel, text):
    path = workspace / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_script_runs_as_main_with_its_argv(runner, capsys, workspace):
    write(
        workspace,
        "scripts/report.py",
        "import sys\n"
        "print(__name__, __file__, sys.argv)\n"
        "if __name__ == '__main__':\n"
        "    print('year', sys.argv[sys.argv.index('--year') + 1])\n"
        "'not displayed'\n",
    )
    result = runner.run(entry("scripts/report.py", "--year", "2024"))
    assert result == {"exit_code": 0, "memory_error": False, "error": None, "results": []}
    out = capsys.readouterr().out
    assert out == (
        "__main__ scripts/report.py ['scripts/report.py', '--year', '2024']\n"
        "year 2024\n"
    )


def test_sibling_modules_import_and_sys_state_is_restored(runner, capsys, workspace):
    write(workspace, "pkg/helper.py", "VALUE = 41\n")
    write(workspace, "pkg/main.py", "import helper\nprint(helper.VALUE + 1)\n")
    before = (list(sys.path), list(sys.argv))
    runner.run(entry("pkg/main.py"))
    assert capsys.readouterr().out == "42\n"
    assert (sys.path, sys.argv) == before
    sys.modules.pop("helper", None)


def test_exit_status_and_traceback_name_the_script(runner, capsys, workspace):
    write(workspace, "s.py", "import sys\nif sys.argv[1:] == ['x']:\n    sys.exit(4)\n1 / 0\n")
    assert runner.run(entry("s.py", "x"))["exit_code"] == 4
    result = runner.run(entry("s.py"))
    assert result["error"] == {"type": "ZeroDivisionError", "message": "division by zero"}
    err = capsys.readouterr().err
    assert 'File "s.py", line 4, in <module>' in err
    assert "    1 / 0\n" in err
    assert "runner" not in err


def test_a_coding_cookie_is_honoured(runner, capsys, workspace):
    (workspace / "latin.py").write_bytes(
        b"# -*- coding: latin-1 -*-\nprint(len('\xe9t\xe9'), '\xe9t\xe9')\n"
    )
    assert runner.run(entry("latin.py"))["exit_code"] == 0
    assert capsys.readouterr().out == "3 \u00e9t\u00e9\n"


def test_a_syntax_error_is_reported_like_python_does(runner, capsys, workspace):
    write(workspace, "bad.py", "x = (1,\n")
    result = runner.run(entry("bad.py"))
    assert result["exit_code"] == 1
    assert result["error"]["type"] == "SyntaxError"
    real = subprocess.run([CPYTHON, "bad.py"], cwd=workspace, capture_output=True, text=True)
    # Python names the script by its absolute path; here it keeps the path it was given.
    assert capsys.readouterr().err == real.stderr.replace(str(workspace / "bad.py"), "bad.py")


def test_a_missing_script_exits_2_like_python(runner, capsys, workspace):
    result = runner.run(entry("nope.py"))
    assert result["exit_code"] == 2
    assert result["error"]["type"] == "FileNotFoundError"
    real = subprocess.run([CPYTHON, "nope.py"], cwd=workspace, capture_output=True, text=True)
    expected = real.stderr.replace(CPYTHON, "python").replace(str(workspace / "nope.py"), "nope.py")
    assert capsys.readouterr().err == expected
    assert real.returncode == 2


def test_args_must_be_strings(runner, workspace):
    write(workspace, "s.py", "pass\n")
    with pytest.raises(TypeError):
        runner.run(entry("s.py", 5))


def test_code_jobs_still_get_main_py_argv(runner, capsys):
    job = {"code": "import sys\nprint(sys.argv, __file__)", "stdin": None, "last_line_interactive": False}
    runner.run(job)
    assert capsys.readouterr().out == "['__main__.py'] __main__.py\n"
