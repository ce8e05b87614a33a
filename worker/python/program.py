"""Owns what a job runs: its program (the ``code`` or an ``entrypoint`` file), read and compiled like ``python __main__.py``.

Loaded by the zygote as the module ``_snakecage_program`` (code objects named
``snakecage/program.py``) after ``report.py``.  A ``code`` job is compiled
under ``SOURCE_FILENAME``; an entrypoint under the relative path it was given,
from its bytes, so a coding cookie is honoured.  With ``last_line_interactive``
a trailing bare expression is compiled apart in ``'single'`` mode, which makes
it call ``sys.displayhook``.

Only the standard library is imported here.
"""

import ast
import io
import os
import tokenize

import _snakecage_report as _report

SOURCE_FILENAME = "__main__.py"
"""The filename user code is compiled under and shown with in tracebacks."""

_report.hide_frames_of((lambda: 0).__code__.co_filename)


class Program:
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


def read_program(job):
    """The job's ``Program``, or a result dict when its entrypoint cannot be read."""
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
        return Program(SOURCE_FILENAME, source, None, [SOURCE_FILENAME, *args], os.getcwd())
    if not isinstance(entrypoint, str):
        raise TypeError("job['entrypoint'] must be a str, not %s" % type(entrypoint).__name__)
    try:
        with open(entrypoint, "rb") as f:
            data = f.read()
    except OSError as exc:
        # What ``python missing.py`` prints (with the path as given, like
        # tracebacks here), with its exit status 2.
        _report.write_stderr("python: can't open file %r: [Errno %s] %s\n" % (entrypoint, exc.errno, exc.strerror))
        _report.flush_std_streams()
        return _report.result(2, error={"type": type(exc).__name__, "message": _report.safe_str(exc)})
    source = _decode_source(data)
    path0 = os.path.dirname(os.path.abspath(entrypoint))
    return Program(entrypoint, source, data, [entrypoint, *args], path0)


def _decode_source(data):
    """The text of a source file, as the parser will read it (coding cookie, BOM)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding, "replace")
    except (SyntaxError, LookupError):
        return data.decode("utf-8", "replace")


def compile_program(program, interactive):
    """Return ``(body, last)`` code objects; ``last`` is the displayed expression or None.

    Either is a coroutine's code (``CO_COROUTINE``) when it awaits at top level.
    """
    source, filename = program.source, program.filename
    if "\0" in source:
        raise _null_byte_error(source, filename)
    try:
        data = program.data if program.data is not None else _as_file_bytes(source)
        tree = ast.parse(data, filename, "exec")
        last = None
        if interactive and tree.body and isinstance(tree.body[-1], ast.Expr):
            if not _ends_with_semicolon(source, tree.body[-1]):
                # 'single' mode makes the expression statement call sys.displayhook.
                last = ast.Interactive(body=[tree.body.pop()])
        # A ``code`` job may ``await`` at top level, as a notebook cell may; an entrypoint
        # is a script, and ``python script.py`` refuses it.
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if program.data is None else 0
        body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
        if last is not None:
            last = compile(last, filename, "single", flags=flags, dont_inherit=True)
        return body, last
    except SyntaxError as exc:
        _use_own_source_line(exc, source, filename)
        raise


def _ends_with_semicolon(source, node):
    """Whether a ``;`` follows the last expression: as in Jupyter, it is run, not shown.

    Only whitespace, a ``;`` and comments can follow the last statement, so the
    text after its end (``end_col_offset`` counts UTF-8 bytes) starts with one or not.
    """
    lines = source.encode("utf-8", "surrogatepass").replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if node.end_lineno is None or node.end_col_offset is None or node.end_lineno > len(lines):
        return False
    rest = lines[node.end_lineno - 1][node.end_col_offset :].lstrip()
    return rest.startswith(b";")


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
    lines = _report.source_lines(source)
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
    lines = _report.source_lines(source)
    if 1 <= exc.lineno <= len(lines):
        exc.text = lines[exc.lineno - 1]

