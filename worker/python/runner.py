"""Owns the Python side of one snakecage job: the entry points the zygote calls, and running a job.

The Rust zygote executes this file as the module ``_snakecage_runner`` (its
code objects are named ``snakecage/runner.py``), calls ``warm_up(asyncio_source)`` once,
forks, calls ``warm_up_child(sources)`` and ``prepare_child()`` in each child
and then ``run(job)``, or
``Session()`` and its ``run(job)``, ``reset()`` and ``variables()`` for as long
as the session lasts.  ``display.py`` (the module ``_snakecage_display``) is
loaded first; it owns the rich outputs every result carries.

User code behaves as under ``python __main__.py`` (the Onyx code-interpreter
contract): it runs in a fresh ``__main__`` module compiled as ``__main__.py``,
uncaught exceptions print CPython's usual traceback (without any frame of
this file) to stderr and give exit code 1, ``SystemExit`` gives its code.
With ``last_line_interactive`` a trailing bare expression is shown through
``sys.displayhook`` like in a REPL or notebook cell. Like a notebook cell, ``code``
may ``await`` at top level: it then runs as a coroutine on an asyncio event loop
(a fresh one per one-shot job, closed with it; one per session, kept between jobs).

A job may name an ``entrypoint`` instead: a file in the working directory (the
workspace) that runs as under ``python <entrypoint> <args...>``: as
``__main__``, with ``sys.argv == [entrypoint, *args]`` and the script's
directory first on ``sys.path``.  Its tracebacks and ``__file__`` use the
relative path it was given.

Only the standard library is imported here: this module is loaded before any
third-party package is known to be importable.

This module owns the entry points and one job's life around the user code
(its ``__main__``, stdin, argv, display hook, the threads it leaves running).
It is loaded last; the parts it imports are loaded before it, in this order:
``alarm.py`` (the runner's own time limits), ``aio.py`` (asyncio in the sandbox, the loop top-level ``await`` runs on),
``display.py`` (rich outputs), ``variables.py`` (a session's variables), ``report.py`` (how a job ends: results, exit
status, tracebacks), ``program.py`` (reading and compiling the program), ``files.py``
(the ``open`` user code calls) and ``state.py`` (interpreter state set once, per child,
around a warm-up).
"""

import builtins
import io
import sys
import types

import _snakecage_aio as _aio
import _snakecage_display as _display
import _snakecage_program as _program
import _snakecage_report as _report
import _snakecage_state as _state
import _snakecage_variables as _variables

_report.hide_frames_of((lambda: 0).__code__.co_filename)
# aio.py loads before report.py, so its frames (a top-level ``await``'s) are hidden here.
_report.hide_frames_of(_aio.is_coroutine_code.__code__.co_filename)


# --------------------------------------------------------------------------
# Public API


class Session:
    """One persistent ``__main__`` module that successive jobs share."""

    _wait_for_threads = False

    def __init__(self):
        self._module = types.ModuleType("__main__")
        _init_main_globals(self._module.__dict__)
        # Top-level ``await`` runs on this loop, made when a job first needs it.
        self._loop = _aio.Loop()

    def run(self, job):
        """Run one job in this session's globals; see ``run`` for the result."""
        stdin, interactive = _read_job(job)
        program = _program.read_program(job)
        if isinstance(program, dict):
            return program  # the entrypoint could not be read
        threads_before = _live_threads()
        namespace = self._module.__dict__
        namespace["__file__"] = program.filename
        collector = _display.begin(job.get("max_bundle_bytes") or 0, job.get("timeout_ms") or 0)
        try:
            with _JobContext(self._module, stdin, program, collector):
                result = _execute(program, namespace, interactive and program.data is None, self._loop)
                if self._wait_for_threads:
                    # Like ``asyncio.run`` at the end of a script: what the job's
                    # top-level ``await`` left running is cancelled, then threads joined.
                    result = _close_loop(self._loop, result, program)
                    result = _wait_for_new_threads(threads_before, result, program)
        finally:
            results = _display.end()
        _report.flush_std_streams()
        result["results"] = results
        return result

    def variables(self):
        """The user globals: ``([{"name", "type", "repr", "shape"?}], total)``, bounded."""
        return _variables.variables(self._module.__dict__)

    def reset(self):
        """Forget every user global; the module object itself is kept."""
        # The tasks of the state go with it, cancelled while their globals still exist.
        # What they print as they unwind has no run to go to (the next one is not
        # theirs), so it is dropped.
        loop, self._loop = self._loop, _aio.Loop()
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.StringIO()
        try:
            loop.close()
        except BaseException:
            pass  # a task that fails to cancel cleanly belongs to the state being dropped
        finally:
            sys.stdout, sys.stderr = saved
        namespace = self._module.__dict__
        namespace.clear()
        _init_main_globals(namespace)


class _OneShotSession(Session):
    # Like ``python __main__.py``, a one-shot job ends only when the threads
    # it started (non-daemon ones) have finished.
    _wait_for_threads = True


def run(job):
    """Run one job in a fresh ``__main__`` module.

    ``job`` is ``{"code": str, "stdin": str | None,
    "last_line_interactive": bool}``, optionally with ``"entrypoint": str``
    (a file to run instead of ``code``), ``"args": [str]``,
    ``"max_bundle_bytes": int`` and ``"timeout_ms": int`` (the job's time limit, which
    drawing the figures it leaves open stops short of).  Returns ``{"exit_code": int, "memory_error":
    bool, "error": None | {"type": str, "message": str}, "results": [bundle]}``
    where each bundle maps MIME types to text (see ``display.py``).
    """
    return _OneShotSession().run(job)


def warm_up(asyncio_source):
    """Run representative jobs through ``run`` so CPython's caches exist before fork.

    ``asyncio_source`` is the async tier's warm-up (``warmup_asyncio.py``), run
    too when this zygote preloads asyncio. All output goes to throwaway
    buffers, and every piece of interpreter state a job touches is put back
    afterwards.
    """
    saved = _state.save_interpreter_state()
    try:
        sys.stdout = io.StringIO()
        sys.stderr = io.StringIO()
        for job in _WARM_UP_JOBS:
            run(job)
        if "asyncio" in sys.modules:
            # A tier that preloads asyncio: a job's first loop, its tasks and their
            # cancellation at the job's end, built once here rather than in each job.
            run({"code": asyncio_source, "stdin": None, "last_line_interactive": True})
        _warm_up_rich_outputs()
    finally:
        _state.restore_interpreter_state(saved)


def _warm_up_rich_outputs():
    """Render one small figure and one DataFrame bundle when their libraries are preloaded,
    so the first job that shows one does not pay for loading fonts and templates."""
    collector = _display.begin()
    try:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            figure = pyplot.figure(figsize=(1, 1))
            figure.gca().plot([0, 1], [0, 1])
        pandas = sys.modules.get("pandas")
        if pandas is not None:
            collector.display(pandas.DataFrame({"a": range(30)}), echo=False)
    except Exception:
        pass  # a broken library only costs its first user the warm-up
    finally:
        _display.end()


def warm_up_child(sources):
    """Run a tier's warm-up jobs in a fresh child, so their copy-on-write faults,
    cold caches and first-use costs are paid before the real job.

    ``sources`` are the ``warmup_*.py`` files this tier's zygote was configured
    with, each run through ``run`` like a request. Unlike ``warm_up`` (the
    zygote's, thorough, paid once), this runs per worker, so each job is small.
    Output is thrown away, figures are closed by the runner after rendering, and
    the interpreter state a job touches is put back. A failing warm-up job only
    costs the next request its first-use costs, so it is ignored.
    """
    saved = _state.save_interpreter_state()
    try:
        sys.stdout = io.StringIO()
        sys.stderr = io.StringIO()
        for source in sources:
            run({"code": source, "stdin": None, "last_line_interactive": True})
    finally:
        _state.restore_interpreter_state(saved)


def prepare_zygote():
    """Once, in the zygote before it forks: what every child inherits for free.

    fd 1 and 2 become the worker's pipes after fork; the stream objects wrapping
    them are inherited, so making them line-buffered here makes every worker's
    output stream line by line. Signal dispositions and builtins (``open`` among them)
    are inherited too.
    """
    for stream in (sys.stdout, sys.stderr):
        _state.line_buffer(stream)
    _state.install_python_signal_defaults()
    _state.install_site_builtins()
    _state.install_reporting_open()


def prepare_child():
    """Make a freshly forked child ready for its first job: per-child state only,
    since everything here is paid again for every worker."""
    _state.reseed_random_generators()


# --------------------------------------------------------------------------
# Job setup


def _read_job(job):
    stdin = job.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise TypeError("job['stdin'] must be a str or None, not %s" % type(stdin).__name__)
    return stdin, bool(job.get("last_line_interactive", False))


def _init_main_globals(namespace):
    """Fill a ``__main__`` namespace the way ``python __main__.py`` does."""
    namespace.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __loader__=None,
        __spec__=None,
        __annotations__={},
        __builtins__=builtins,
        __file__=_program.SOURCE_FILENAME,
        __cached__=None,
    )


def _stdin_stream(text):
    """A text stream over ``text`` that, like the real stdin, also has ``.buffer``."""
    data = (text or "").encode("utf-8", "replace")
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")


class _JobContext:
    """Installs the job's ``__main__`` module, stdin, argv, ``sys.path[0]``, display hook
    and ``display`` builtin; restores them after."""

    def __init__(self, module, stdin, program, collector):
        self._module = module
        self._stdin = stdin
        self._program = program
        self._collector = collector
        self._saved = None

    def __enter__(self):
        self._saved = (
            sys.modules.get("__main__", _state.MISSING),
            sys.stdin,
            sys.__dict__.get("argv", _state.MISSING),
            list(sys.path),
            sys.displayhook,
            builtins.__dict__.get("display", _state.MISSING),
        )
        sys.modules["__main__"] = self._module
        sys.stdin = _stdin_stream(self._stdin)
        sys.argv = list(self._program.argv)
        if self._program.path0 is not None:
            sys.path.insert(0, self._program.path0)
        sys.displayhook = self._collector.displayhook
        builtins.display = _display.display
        return self

    def __exit__(self, *exc_info):
        main, sys.stdin, argv, path, sys.displayhook, display = self._saved
        _state.restore_item(sys.modules, "__main__", main)
        _state.restore_item(sys.__dict__, "argv", argv)
        _state.restore_item(builtins.__dict__, "display", display)
        if self._program.path0 is not None:
            sys.path[:] = path
        return False


# --------------------------------------------------------------------------
# Compiling and executing


def _execute(program, namespace, interactive, loop):
    """Compile and run ``program`` in ``namespace``; report what escaped it. Code that
    awaits at top level runs as a coroutine on ``loop`` (an ``_aio.Loop``)."""
    try:
        _report.register_source(program)
        body, last = _program.compile_program(program, interactive)
    except BaseException as exc:
        # Like ``python __main__.py``: a file that fails to compile is
        # reported without a traceback (its frames would be ours and ast's).
        return _report.report_uncaught(exc.with_traceback(None), program)
    try:
        if _aio.is_coroutine_code(body) or _aio.is_coroutine_code(last):
            loop.run(body, last, namespace, program.filename)
        else:
            exec(body, namespace)
            if last is not None:
                exec(last, namespace)
    except SystemExit as exc:
        return _report.result(_report.system_exit_status(exc))
    except BaseException as exc:
        return _report.report_uncaught(exc, program)
    return _report.result(0)


# --------------------------------------------------------------------------
# Tasks and threads left running by a one-shot job


def _close_loop(loop, result, program):
    """Close a one-shot job's event loop, cancelling its tasks; report what that raised."""
    try:
        loop.close(one_shot=True)
    except SystemExit as exc:
        if result["exit_code"] == 0:
            return _report.result(_report.system_exit_status(exc))
    except BaseException as exc:
        if result["exit_code"] == 0:
            return _report.report_uncaught(exc, program)
    return result


def _live_threads():
    threading = sys.modules.get("threading")
    return set(threading.enumerate()) if threading is not None else set()


def _wait_for_new_threads(threads_before, result, program):
    """Join non-daemon threads the job started, as interpreter shutdown would:
    threading's exit hooks first (an executor the program never shut down tells
    its idle threads to stop there), then a join of each thread."""
    threading = sys.modules.get("threading")
    if threading is None:
        return result
    current = threading.current_thread()

    def left():
        return [
            t
            for t in threading.enumerate()
            if t is not current and not t.daemon and t not in threads_before
        ]

    try:
        if left():
            # Only then: warm-up jobs leave no thread, and must not stop the
            # executors of the process they warm.
            _run_threading_exit_hooks(threading)
        for thread in left():
            thread.join()
    except KeyboardInterrupt as exc:
        if result["exit_code"] == 0:
            return _report.report_uncaught(exc, program)
    return result


def _run_threading_exit_hooks(threading):
    # What ``threading._shutdown`` does before it joins (CPython 3.9+), e.g.
    # ``concurrent.futures``' hook that stops the idle threads of every
    # executor. A one-shot worker exits after its job: nothing is scheduled on
    # an executor after this.
    for hook in reversed(getattr(threading, "_threading_atexits", ())):
        hook()


# --------------------------------------------------------------------------
# Warm-up


_WARM_UP_JOBS = (
    {
        "code": (
            "import sys\n"
            "name = input('name? ')\n"
            "def divide(a, b):\n"
            "    return a / b\n"
            "try:\n"
            "    divide(len(name), 0)\n"
            "except ZeroDivisionError as exc:\n"
            "    raise ValueError('bad input') from exc\n"
        ),
        "stdin": "warm\n",
        "last_line_interactive": False,
    },
    {
        "code": "total = sum(i * i for i in range(10))\nprint(total)\n{'total': total}\n",
        "stdin": None,
        "last_line_interactive": True,
    },
    {"code": "import sys\nsys.exit('stopped')\n", "stdin": None, "last_line_interactive": False},
    {"code": "x = (1,\n", "stdin": None, "last_line_interactive": True},
)


