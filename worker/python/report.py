"""Owns how a job ends: its result, its exit status, its uncaught exception as ``python __main__.py`` prints it.

Loaded by the zygote as the module ``_snakecage_report`` (code objects named
``snakecage/report.py``) after ``display.py`` and before the rest of the runner.
Tracebacks read the job's lines from ``linecache`` (``register_source``) and
leave out every frame of the runner's own modules: each of them names its code
filename through ``hide_frames_of`` when it loads, and this module's frames are
hidden from the start.

Only the standard library is imported here.
"""

import io
import linecache
import os
import sys
import traceback
import types

_C_LONG_MIN = -(2**63)
_C_LONG_MAX = 2**63 - 1
_LAST_RESORT_MESSAGE = b"snakecage: the uncaught exception could not be printed\n"

_HIDDEN_FILENAMES = {(lambda: 0).__code__.co_filename}
"""Code filenames of the runner's modules, whose frames user tracebacks leave out."""


def hide_frames_of(filename):
    """Leave frames whose code filename is ``filename`` out of user tracebacks."""
    _HIDDEN_FILENAMES.add(filename)


def result(exit_code, memory_error=False, error=None):
    return {"exit_code": exit_code, "memory_error": memory_error, "error": error, "results": []}


def system_exit_status(exc):
    """The exit status CPython's ``_Py_HandleSystemExit`` would give the process."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        if not _C_LONG_MIN <= code <= _C_LONG_MAX:
            return 255  # PyLong_AsLong overflows to -1
        return code & 0xFF
    try:
        write_stderr(safe_str(code) + "\n")
    except BaseException:
        pass  # stderr is gone; the exit status still says it failed
    return 1


def report_uncaught(exc, program):
    """Print ``exc`` like CPython's excepthook and describe it in a result.

    The program's source is put back into linecache first in case user code
    cleared it.
    """
    memory_error = isinstance(exc, MemoryError) and not _parser_overflow(exc)
    exc.__traceback__ = _without_leading_hidden_frames(exc.__traceback__)
    if memory_error:
        # The user's locals are no longer needed; free them before formatting.
        traceback.clear_frames(exc.__traceback__)
    try:
        register_source(program)
        _print_exception(exc)
    except BaseException:
        _print_fallback_line(exc)
    return result(1, memory_error, _describe(exc))


# CPython's parser raises MemoryError with this message for source nested too deeply to
# parse (``x = ----...1``, a hundred thousand deep): the source's fault, not the job's memory budget.
_PARSER_OVERFLOW = "Parser stack overflowed"


def _parser_overflow(exc):
    return type(exc) is MemoryError and safe_str(exc).startswith(_PARSER_OVERFLOW)


# The ``error`` entry's bounds, in characters. Its message goes to the client whole where
# stderr (which has the full traceback) is cut at the output limit, and it travels in the
# result frame: an exception carrying tens of megabytes of text would otherwise push the
# frame past its limit and lose the whole result.
_MAX_ERROR_MESSAGE = 8192
_MAX_ERROR_TYPE = 256
_TRUNCATION_MARK = "\n...[truncated]"


def _describe(exc):
    """The ``error`` entry: the type name and the text after it on the last line."""
    if isinstance(exc, SyntaxError) and exc.msg is not None:
        message = safe_str(exc.msg)
    else:
        message = safe_str(exc)
    return {
        "type": _bounded(type(exc).__name__, _MAX_ERROR_TYPE),
        "message": _bounded(message, _MAX_ERROR_MESSAGE),
    }


def _bounded(text, limit):
    """``text`` cut to ``limit`` characters and marked as the output streams are."""
    return text if len(text) <= limit else text[:limit] + _TRUNCATION_MARK


def safe_str(value):
    try:
        return str(value)
    except BaseException:
        return "<exception str() failed>"


def _without_leading_hidden_frames(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename in _HIDDEN_FILENAMES:
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
        hook_exc.__traceback__ = _without_leading_hidden_frames(hook_exc.__traceback__)
        write_stderr("Error in sys.excepthook:\n")
        _print_traceback(hook_exc)
        write_stderr("\nOriginal exception was:\n")
        _print_traceback(exc)


def _print_traceback(exc):
    """Print like ``traceback.print_exception``, minus every frame of the runner's modules.

    Uses the traceback module rather than the C excepthook because only the
    former reads source lines from linecache, where the job's code is.
    """
    summary = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    for part in _chained_summaries(summary):
        part.stack[:] = [f for f in part.stack if f.filename not in _HIDDEN_FILENAMES]
        if part.exc_type is not None and issubclass(part.exc_type, SyntaxError):
            part._format_syntax_error = types.MethodType(_format_syntax_error_like_c, part)
    for chunk in summary.format():
        write_stderr(chunk)


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
    """Lines for a SyntaxError as CPython's C printer (pythonrun.c) writes them.

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
    yield _message_line(stype, None if summary.msg is None else safe_str(summary.msg))


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
        write_stderr(_message_line(type(exc).__name__, safe_str(exc)))
    except BaseException:
        try:
            os.write(2, _LAST_RESORT_MESSAGE)
        except BaseException:
            pass


def write_stderr(text):
    stream = sys.stderr
    if stream is None:
        os.write(2, text.encode("utf-8", "backslashreplace"))
    else:
        stream.write(text)


def flush_std_streams():
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
# The job's source in linecache


def register_source(program):
    """Put the program's source in linecache so tracebacks show the lines that ran."""
    source, filename = program.source, program.filename
    lines = source_lines(source)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    # mtime None marks the entry as not backed by a file: checkcache keeps it.
    linecache.cache[filename] = (len(source), None, lines, filename)


def source_lines(source):
    """Split ``source`` into lines the way the parser and a text-mode file do.

    Only ``\\n``, ``\\r\\n`` and ``\\r`` end a line (``str.splitlines`` would
    also split at form feeds and U+2028, shifting every later line number).
    """
    return io.StringIO(source, newline=None).readlines()

