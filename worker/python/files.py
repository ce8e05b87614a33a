"""Owns the ``open`` user code calls: files opened for writing whose data is lost when they are closed by the garbage collector say so.

Loaded by the zygote as the module ``_snakecage_files`` (code objects named
``snakecage/files.py``) after ``program.py``; ``state.py`` installs :func:`open` as
``builtins.open`` and ``io.open`` in the zygote, so every child inherits it.

A file that is never closed explicitly (``open('r.txt', 'w').write('hi')``) is flushed
and closed by its finaliser. When that flush fails (``ENOSPC`` on a full workspace) the
data is lost, and CPython 3.12 drops the error without a word unless it runs in
development mode (3.13 reports it, gh-62948): the program ends ``ok`` with an empty file.
The files :func:`open` returns for writing report it instead, as 3.13 does, through
``sys.unraisablehook``: ``Exception ignored in: <TextIOWrapper name='r.txt' ...>`` and
the error on the job's stderr.

Only the standard library is imported here.
"""

import functools
import io
import os
import sys

import _snakecage_report as _report

_report.hide_frames_of((lambda: 0).__code__.co_filename)

_io_open = io.open
"""CPython's own ``open``: it does the work (and raises the ``open`` audit event)."""


def _unraisable_hook_args_type():
    """The type ``sys.unraisablehook`` is called with (``sys`` does not name it), from
    one report made to a hook of our own."""
    reports = []
    hook = sys.unraisablehook
    sys.unraisablehook = reports.append

    class Probe:
        def __del__(self):
            raise RuntimeError

    try:
        Probe()
    finally:
        sys.unraisablehook = hook
    return type(reports[0])


_UnraisableHookArgs = _unraisable_hook_args_type()


def _close_or_report(file):
    """Close ``file`` from its finaliser; report a failure as CPython 3.13 does."""
    try:
        if file.closed:
            return
    except ValueError:
        return  # detached: its buffer belongs to someone else now
    try:
        file.close()
    except Exception as error:
        # Without a traceback: it would show only this module's frames.
        sys.unraisablehook(_UnraisableHookArgs((type(error), error, None, None, file)))


class TextIOWrapper(io.TextIOWrapper):
    """A text file opened for writing by user code (see the module's documentation)."""

    def __del__(self):
        _close_or_report(self)


class BufferedWriter(io.BufferedWriter):
    """A binary file opened for writing by user code."""

    def __del__(self):
        _close_or_report(self)


class BufferedRandom(io.BufferedRandom):
    """A binary file opened for reading and writing by user code."""

    def __del__(self):
        _close_or_report(self)


_BUFFERED = {io.BufferedWriter: BufferedWriter, io.BufferedRandom: BufferedRandom}


def _buffer_size(raw, buffering):
    """The buffer size ``io.open`` gives ``raw`` for ``buffering``."""
    if buffering > 1:
        return buffering
    try:
        block = os.fstat(raw.fileno()).st_blksize
    except (OSError, AttributeError, ValueError):
        block = 0
    return block if block > 1 else io.DEFAULT_BUFFER_SIZE


@functools.wraps(_io_open)
def open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True,
         opener=None):
    """``io.open``; a file opened for writing reports a close its finaliser could not do."""
    opened = _io_open(file, mode, buffering, encoding, errors, newline, closefd, opener)
    kind = type(opened)
    if kind is io.TextIOWrapper and opened.writable():
        # The same layers with the same settings; only the text layer is new.
        settings = (opened.encoding, opened.errors, newline, opened.line_buffering,
                    opened.write_through)
        text_mode = opened.mode
        text = TextIOWrapper(opened.detach(), *settings)
        text.mode = text_mode
        return text
    if kind in _BUFFERED:
        raw = opened.detach()
        return _BUFFERED[kind](raw, _buffer_size(raw, buffering))
    return opened
