"""Owns the Python side of one snakecage job: compile, run, display, report.

The Rust zygote executes this file as the module ``_snakecage_runner`` (its
code objects are named ``snakecage/runner.py``), calls ``warm_up()`` once,
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
``sys.displayhook`` like in a REPL or notebook cell.

A job may name an ``entrypoint`` instead: a file in the working directory (the
workspace) that runs as under ``python <entrypoint> <args...>``: as
``__main__``, with ``sys.argv == [entrypoint, *args]`` and the script's
directory first on ``sys.path``.  Its tracebacks and ``__file__`` use the
relative path it was given.

Only the standard library is imported here: this module is loaded before any
third-party package is known to be importable.
"""

import _sitebuiltins
import ast
import builtins
import io
import linecache
import os
import signal
import sys
import tokenize
import traceback
import types

import _snakecage_display as _display

SOURCE_FILENAME = "__main__.py"
"""The filename user code is compiled under and shown with in tracebacks."""

_RUNNER_FILENAME = (lambda: 0).__code__.co_filename
_MISSING = object()
_C_LONG_MIN = -(2**63)
_C_LONG_MAX = 2**63 - 1
_LAST_RESORT_MESSAGE = b"snakecage: the uncaught exception could not be printed\n"


# --------------------------------------------------------------------------
# Public API


class Session:
    """One persistent ``__main__`` module that successive jobs share."""

    _wait_for_threads = False

    def __init__(self):
        self._module = types.ModuleType("__main__")
        _init_main_globals(self._module.__dict__)

    def run(self, job):
        """Run one job in this session's globals; see ``run`` for the result."""
        stdin, interactive = _read_job(job)
        program = _read_program(job)
        if isinstance(program, dict):
            return program  # the entrypoint could not be read
        threads_before = _live_threads()
        namespace = self._module.__dict__
        namespace["__file__"] = program.filename
        collector = _display.begin(job.get("max_bundle_bytes") or 0)
        try:
            with _JobContext(self._module, stdin, program, collector):
                result = _execute(program, namespace, interactive and program.data is None)
                if self._wait_for_threads:
                    result = _wait_for_new_threads(threads_before, result, program)
        finally:
            results = _display.end()
        _flush_std_streams()
        result["results"] = results
        return result

    def variables(self):
        """The user globals: ``[{"name", "type", "repr", "shape"?}]``, bounded."""
        return _display.variables(self._module.__dict__)

    def reset(self):
        """Forget every user global; the module object itself is kept."""
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
    (a file to run instead of ``code``), ``"args": [str]`` and
    ``"max_bundle_bytes": int``.  Returns ``{"exit_code": int, "memory_error":
    bool, "error": None | {"type": str, "message": str}, "results": [bundle]}``
    where each bundle maps MIME types to text (see ``display.py``).
    """
    return _OneShotSession().run(job)


def warm_up():
    """Run representative jobs through ``run`` so CPython's caches exist before fork.

    All output goes to throwaway buffers, and every piece of interpreter
    state a job touches is put back afterwards.
    """
    saved = _save_interpreter_state()
    try:
        sys.stdout = io.StringIO()
        sys.stderr = io.StringIO()
        for job in _WARM_UP_JOBS:
            run(job)
        _warm_up_rich_outputs()
    finally:
        _restore_interpreter_state(saved)


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
    saved = _save_interpreter_state()
    try:
        sys.stdout = io.StringIO()
        sys.stderr = io.StringIO()
        for source in sources:
            run({"code": source, "stdin": None, "last_line_interactive": True})
    finally:
        _restore_interpreter_state(saved)


def describe_packages(names):
    """For each allowed top-level package: installed or not, and the version of the
    distribution that provides it, found without importing it (start-up only)."""
    import importlib.metadata
    import importlib.util

    providers = importlib.metadata.packages_distributions()
    described = []
    for name in names:
        try:
            installed = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            installed = False
        version = None
        for dist in providers.get(name, ()):
            try:
                version = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        described.append({"name": name, "installed": installed, "version": version})
    return described


def prepare_zygote():
    """Once, in the zygote before it forks: what every child inherits for free.

    fd 1 and 2 become the worker's pipes after fork; the stream objects wrapping
    them are inherited, so making them line-buffered here makes every worker's
    output stream line by line. Signal dispositions and builtins are inherited too.
    """
    for stream in (sys.stdout, sys.stderr):
        _line_buffer(stream)
    _install_python_signal_defaults()
    _install_site_builtins()


def prepare_child():
    """Make a freshly forked child ready for its first job: per-child state only,
    since everything here is paid again for every worker."""
    _reseed_random_generators()


# --------------------------------------------------------------------------
# Job setup


def _read_job(job):
    stdin = job.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise TypeError("job['stdin'] must be a str or None, not %s" % type(stdin).__name__)
    return stdin, bool(job.get("last_line_interactive", False))


class _Program:
    """What a job runs: its source, the name it is compiled under, its argv.

    ``data`` is the file's bytes for an entrypoint (parsed as such, so a
    coding cookie is honoured) and None for ``code``.
    """

    def __init__(self, filename, source, data, argv, path0):
        self.filename = filename
        self.source = source
        self.data = data
        self.argv = argv
        self.path0 = path0


def _read_program(job):
    """The job's ``_Program``, or a result dict when its entrypoint cannot be read."""
    entrypoint = job.get("entrypoint")
    args = job.get("args") or []
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise TypeError("job['args'] must be a list of str")
    if entrypoint is None:
        source = job["code"]
        if not isinstance(source, str):
            raise TypeError("job['code'] must be a str, not %s" % type(source).__name__)
        # ``python __main__.py`` puts the script's directory (the workspace) first on
        # sys.path, so code can import the modules it was given alongside it.
        return _Program(SOURCE_FILENAME, source, None, [SOURCE_FILENAME, *args], os.getcwd())
    if not isinstance(entrypoint, str):
        raise TypeError("job['entrypoint'] must be a str, not %s" % type(entrypoint).__name__)
    try:
        with open(entrypoint, "rb") as f:
            data = f.read()
    except OSError as exc:
        # What ``python missing.py`` prints (with the path as given, like
        # tracebacks here), with its exit status 2.
        _write_stderr("python: can't open file %r: [Errno %s] %s\n" % (entrypoint, exc.errno, exc.strerror))
        _flush_std_streams()
        return _result(2, error={"type": type(exc).__name__, "message": _safe_str(exc)})
    source = _decode_source(data)
    path0 = os.path.dirname(os.path.abspath(entrypoint))
    return _Program(entrypoint, source, data, [entrypoint, *args], path0)


def _decode_source(data):
    """The text of a source file, as the parser will read it (coding cookie, BOM)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding, "replace")
    except (SyntaxError, LookupError):
        return data.decode("utf-8", "replace")


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
        __file__=SOURCE_FILENAME,
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
            sys.modules.get("__main__", _MISSING),
            sys.stdin,
            sys.__dict__.get("argv", _MISSING),
            list(sys.path),
            sys.displayhook,
            builtins.__dict__.get("display", _MISSING),
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
        _restore_item(sys.modules, "__main__", main)
        _restore_item(sys.__dict__, "argv", argv)
        _restore_item(builtins.__dict__, "display", display)
        if self._program.path0 is not None:
            sys.path[:] = path
        return False


# --------------------------------------------------------------------------
# Compiling and executing


def _execute(program, namespace, interactive):
    """Compile and run ``program`` in ``namespace``; report what escaped it."""
    try:
        _register_source(program)
        body, last = _compile(program, interactive)
    except BaseException as exc:
        # Like ``python __main__.py``: a file that fails to compile is
        # reported without a traceback (its frames would be ours and ast's).
        return _report_uncaught(exc.with_traceback(None), program)
    try:
        exec(body, namespace)
        if last is not None:
            exec(last, namespace)
    except SystemExit as exc:
        return _result(_system_exit_status(exc))
    except BaseException as exc:
        return _report_uncaught(exc, program)
    return _result(0)


def _register_source(program):
    """Put the program's source in linecache so tracebacks show the lines that ran."""
    source, filename = program.source, program.filename
    lines = _source_lines(source)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    # mtime None marks the entry as not backed by a file: checkcache keeps it.
    linecache.cache[filename] = (len(source), None, lines, filename)


def _source_lines(source):
    """Split ``source`` into lines the way the parser and a text-mode file do.

    Only ``\\n``, ``\\r\\n`` and ``\\r`` end a line (``str.splitlines`` would
    also split at form feeds and U+2028, shifting every later line number).
    """
    return io.StringIO(source, newline=None).readlines()


def _compile(program, interactive):
    """Return ``(body, last)`` code objects; ``last`` is the displayed expression or None."""
    source, filename = program.source, program.filename
    if "\0" in source:
        raise _null_byte_error(source, filename)
    try:
        data = program.data if program.data is not None else _as_file_bytes(source)
        tree = ast.parse(data, filename, "exec")
        last = None
        if interactive and tree.body and isinstance(tree.body[-1], ast.Expr):
            # 'single' mode makes the expression statement call sys.displayhook.
            last = ast.Interactive(body=[tree.body.pop()])
        body = compile(tree, filename, "exec", dont_inherit=True)
        if last is not None:
            last = compile(last, filename, "single", dont_inherit=True)
        return body, last
    except SyntaxError as exc:
        _use_own_source_line(exc, source, filename)
        raise


def _as_file_bytes(source):
    """``source`` as ``python __main__.py`` would read it from disk.

    Parsing bytes rather than str makes SyntaxError offsets byte-based, as
    the C printer expects for non-ASCII lines.  Text that cannot be UTF-8
    (lone surrogates) is parsed as str.
    """
    try:
        return source.encode("utf-8")
    except UnicodeEncodeError:
        return source


def _null_byte_error(source, filename):
    # ast.parse says "source code string cannot ..." without a location; show
    # what ``python __main__.py`` shows instead.
    lines = _source_lines(source)
    lineno = next(number for number, line in enumerate(lines, 1) if "\0" in line)
    text = lines[lineno - 1].rstrip("\n").replace("\0", "") + "\n"
    return SyntaxError("source code cannot contain null bytes", (filename, lineno, None, text))


def _use_own_source_line(exc, source, filename):
    """Make a SyntaxError quote ``source``.

    For some errors CPython's parser reads the offending line back from the
    file named in the error; a ``__main__.py`` in the working directory would
    then be quoted instead of the job's code.
    """
    if exc.filename != filename or not isinstance(exc.lineno, int):
        return
    lines = _source_lines(source)
    if 1 <= exc.lineno <= len(lines):
        exc.text = lines[exc.lineno - 1]


# --------------------------------------------------------------------------
# Outcomes


def _result(exit_code, memory_error=False, error=None):
    return {"exit_code": exit_code, "memory_error": memory_error, "error": error, "results": []}


def _system_exit_status(exc):
    """The exit status CPython's ``_Py_HandleSystemExit`` would give the process."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        if not _C_LONG_MIN <= code <= _C_LONG_MAX:
            return 255  # PyLong_AsLong overflows to -1
        return code & 0xFF
    try:
        _write_stderr(_safe_str(code) + "\n")
    except BaseException:
        pass  # stderr is gone; the exit status still says it failed
    return 1


def _report_uncaught(exc, program):
    """Print ``exc`` like CPython's excepthook and describe it in a result.

    The program's source is put back into linecache first in case user code
    cleared it.
    """
    memory_error = isinstance(exc, MemoryError)
    exc.__traceback__ = _without_leading_runner_frames(exc.__traceback__)
    if memory_error:
        # The user's locals are no longer needed; free them before formatting.
        traceback.clear_frames(exc.__traceback__)
    try:
        _register_source(program)
        _print_exception(exc)
    except BaseException:
        _print_fallback_line(exc)
    return _result(1, memory_error, _describe(exc))


def _describe(exc):
    """The ``error`` entry: the type name and the text after it on the last line."""
    if isinstance(exc, SyntaxError) and exc.msg is not None:
        message = _safe_str(exc.msg)
    else:
        message = _safe_str(exc)
    return {"type": type(exc).__name__, "message": message}


def _safe_str(value):
    try:
        return str(value)
    except BaseException:
        return "<exception str() failed>"


def _without_leading_runner_frames(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename == _RUNNER_FILENAME:
        tb = tb.tb_next
    return tb


def _print_exception(exc):
    hook = sys.excepthook
    if hook is sys.__excepthook__ or not callable(hook):
        _print_traceback(exc)
        return
    try:
        hook(type(exc), exc, exc.__traceback__)
    except BaseException as hook_exc:
        # What CPython's PyErr_PrintEx does when sys.excepthook fails.
        hook_exc.__traceback__ = _without_leading_runner_frames(hook_exc.__traceback__)
        _write_stderr("Error in sys.excepthook:\n")
        _print_traceback(hook_exc)
        _write_stderr("\nOriginal exception was:\n")
        _print_traceback(exc)


def _print_traceback(exc):
    """Print like ``traceback.print_exception``, minus every frame of this file.

    Uses the traceback module rather than the C excepthook because only the
    former reads source lines from linecache, where the job's code is.
    """
    summary = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    for part in _chained_summaries(summary):
        part.stack[:] = [f for f in part.stack if f.filename != _RUNNER_FILENAME]
        if part.exc_type is not None and issubclass(part.exc_type, SyntaxError):
            part._format_syntax_error = types.MethodType(_format_syntax_error_like_c, part)
    for chunk in summary.format():
        _write_stderr(chunk)


def _chained_summaries(summary):
    """A TracebackException and every one it chains to (cause, context, group)."""
    pending, seen, found = [summary], set(), []
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        pending.extend((current.__cause__, current.__context__))
        pending.extend(current.exceptions or ())
    return found


def _format_syntax_error_like_c(summary, stype):
    """Lines for a SyntaxError as 3.11's C printer (pythonrun.c) writes them.

    ``python __main__.py`` reports through that printer, whose caret line
    differs from the traceback module's: subclasses such as IndentationError
    get one caret, and tabs are stripped from the quoted line.  Replaces
    ``TracebackException._format_syntax_error``; ``summary`` is its ``self``.
    """
    try:
        lineno = int(summary.lineno)
    except (TypeError, ValueError):
        # The C printer cannot read the location and prints str(exc).
        yield _message_line(stype, summary._str)
        return
    filename = "<string>" if summary.filename is None else summary.filename
    yield '  File "%s", line %d\n' % (filename, lineno)
    if summary.text is not None:
        offset, end_offset = _c_caret_span(summary, lineno)
        yield from _c_error_text(offset, end_offset, summary.text)
    yield _message_line(stype, None if summary.msg is None else _safe_str(summary.msg))


def _c_caret_span(summary, lineno):
    """The (offset, end_offset) pair pythonrun.c passes to print_error_text."""
    offset = summary.offset if isinstance(summary.offset, int) else -1
    end_lineno, end_offset = lineno, -1
    if summary.exc_type is SyntaxError:  # subclasses keep end_offset -1
        if summary.end_lineno is not None:
            end_lineno = int(summary.end_lineno)
        if isinstance(summary.end_offset, int):
            end_offset = summary.end_offset
    line_size = len(summary.text.encode("utf-8", "surrogatepass"))
    if end_lineno > lineno:
        end_offset = line_size
    if end_offset > line_size + 1:
        end_offset = line_size + 1
    return offset, end_offset


def _c_error_text(offset, end_offset, text):
    """pythonrun.c's print_error_text: the quoted line and its caret line."""
    carets = end_offset - offset if end_offset > 0 and end_offset > offset else 1
    data = text.encode("utf-8", "surrogatepass")
    offset -= 1  # 1-based to 0-based
    stripped = data.lstrip(b" \t\f")
    offset -= len(data) - len(stripped)
    data = stripped
    length = len(data) - 1 if data.endswith(b"\n") else len(data)
    offset = min(offset, length)
    while True:  # skip past newlines embedded in the text
        newline = data.find(b"\n")
        if newline == -1 or newline >= offset:
            break
        data, length, offset = data[newline + 1:], length - newline - 1, offset - newline - 1
    quoted = "    " + data.decode("utf-8", "replace")
    yield quoted if data[length:length + 1] == b"\n" else quoted + "\n"
    if offset >= 0:
        yield "    " + " " * offset + "^" * carets + "\n"


def _message_line(stype, message):
    """``Type: message``, or just ``Type`` when the message is empty or None."""
    return "%s: %s\n" % (stype, message) if message else stype + "\n"


def _print_fallback_line(exc):
    """Last resort when formatting failed (e.g. out of memory): one short line."""
    try:
        _write_stderr(_message_line(type(exc).__name__, _safe_str(exc)))
    except BaseException:
        try:
            os.write(2, _LAST_RESORT_MESSAGE)
        except BaseException:
            pass


def _write_stderr(text):
    stream = sys.stderr
    if stream is None:
        os.write(2, text.encode("utf-8", "backslashreplace"))
    else:
        stream.write(text)


def _flush_std_streams():
    """Flush the current and original std streams; a broken one is ignored."""
    streams = []
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None and all(stream is not s for s in streams):
            streams.append(stream)
    for stream in streams:
        try:
            stream.flush()
        except BaseException:  # closed, broken pipe, or a user object's flush
            pass


# --------------------------------------------------------------------------
# Threads left running by a one-shot job


def _live_threads():
    threading = sys.modules.get("threading")
    return set(threading.enumerate()) if threading is not None else set()


def _wait_for_new_threads(threads_before, result, program):
    """Join non-daemon threads the job started, as interpreter shutdown would."""
    threading = sys.modules.get("threading")
    if threading is None:
        return result
    current = threading.current_thread()
    try:
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon and thread not in threads_before:
                thread.join()
    except KeyboardInterrupt as exc:
        if result["exit_code"] == 0:
            return _report_uncaught(exc, program)
    return result


# --------------------------------------------------------------------------
# Child preparation


def _line_buffer(stream):
    try:
        stream.reconfigure(line_buffering=True)
    except (AttributeError, ValueError, OSError):
        pass  # not a TextIOWrapper, or closed


def _reseed_random_generators():
    """Forked children share the zygote's generator state; give each its own.

    ``random`` needs nothing: CPython reseeds it in its own after-fork hook.
    numpy's legacy global generator gets a full MT19937 key from the OS;
    ``set_state`` costs well under half of ``seed()``, which goes through
    SeedSequence (0.25 ms against 0.6 ms in a freshly forked child).
    """
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is None:
        return
    try:
        import numpy

        key = numpy.frombuffer(os.urandom(624 * 4), dtype=numpy.uint32)
        numpy_random.set_state(("MT19937", key, 624))
    except Exception:
        # A broken numpy must not stop the worker; its generator keeps the
        # zygote's state, which only matters to code that relies on it.
        pass


def _install_python_signal_defaults():
    """Give signals the dispositions ``python`` sets at startup, where still default.

    An embedding interpreter may skip this (Py_InitializeEx(0)); without it
    SIGINT would kill the child instead of raising KeyboardInterrupt.
    """
    wanted = [(signal.SIGINT, signal.default_int_handler)]
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            wanted.append((getattr(signal, name), signal.SIG_IGN))
    for signum, handler in wanted:
        try:
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, handler)
        except (OSError, ValueError):
            pass


def _install_site_builtins():
    """Add ``exit``, ``quit`` and ``help``, which ``site`` (disabled here) provides."""
    defaults = {
        "exit": lambda: _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)"),
        "quit": lambda: _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)"),
        "help": _sitebuiltins._Helper,
    }
    for name, make in defaults.items():
        if not hasattr(builtins, name):
            setattr(builtins, name, make())


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


def _save_interpreter_state():
    return {
        "stdout": sys.stdout,
        "stderr": sys.stderr,
        "stdin": sys.stdin,
        "argv": sys.__dict__.get("argv", _MISSING),
        "main": sys.modules.get("__main__", _MISSING),
        "underscore": builtins.__dict__.get("_", _MISSING),
        "linecache": linecache.cache.get(SOURCE_FILENAME, _MISSING),
    }


def _restore_interpreter_state(saved):
    sys.stdout = saved["stdout"]
    sys.stderr = saved["stderr"]
    sys.stdin = saved["stdin"]
    _restore_item(sys.__dict__, "argv", saved["argv"])
    _restore_item(sys.modules, "__main__", saved["main"])
    _restore_item(builtins.__dict__, "_", saved["underscore"])
    _restore_item(linecache.cache, SOURCE_FILENAME, saved["linecache"])


def _restore_item(mapping, key, value):
    if value is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = value
