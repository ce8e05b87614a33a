"""Owns the interpreter state around jobs: process-wide settings every child inherits, per-child reseeding, and the state a warm-up puts back.

Loaded by the zygote as the module ``_snakecage_state`` (code objects named
``snakecage/state.py``) after ``files.py``.  The zygote makes the std streams
line-buffered and installs the signal dispositions and builtins that ``python``
(with ``site``) would have, and the ``open`` of ``files.py``; each child reseeds the random generators it shares
with its siblings; a warm-up saves and restores what a job touches.

Only the standard library is imported here.
"""

import _sitebuiltins
import builtins
import io
import linecache
import os
import signal
import sys

import _snakecage_files as _files
import _snakecage_program as _program
import _snakecage_report as _report

MISSING = object()
"""Stands for a key or attribute that was not there, so restoring removes it."""

_report.hide_frames_of((lambda: 0).__code__.co_filename)


# --------------------------------------------------------------------------
# Once, in the zygote: inherited by every child


def line_buffer(stream):
    try:
        stream.reconfigure(line_buffering=True)
    except (AttributeError, ValueError, OSError):
        pass  # not a TextIOWrapper, or closed


def install_python_signal_defaults():
    """Give signals the dispositions the workers rely on.

    SIGINT raises ``KeyboardInterrupt``, whatever the zygote inherited: the supervisor
    interrupts an overdue session job with it. A service started in the background of a
    shell (or by any launcher that ignores SIGINT) inherits it ignored, and CPython leaves
    an ignored SIGINT alone, so without this a session's deadline would kill the session
    instead of interrupting its job. SIGPIPE and SIGXFSZ are ignored where still default,
    as ``python`` does at startup.
    """
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except (OSError, ValueError):
        pass
    for name in ("SIGPIPE", "SIGXFSZ"):
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        try:
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_IGN)
        except (OSError, ValueError):
            pass


def install_reporting_open():
    """Make ``open`` (``builtins.open`` and ``io.open``) the one of ``files.py``, whose
    files opened for writing report a close their finaliser could not do."""
    builtins.open = _files.open
    io.open = _files.open


def install_site_builtins():
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
# In each child


def reseed_random_generators():
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


# --------------------------------------------------------------------------
# Around a warm-up: what a job touches, put back after


def save_interpreter_state():
    return {
        "stdout": sys.stdout,
        "stderr": sys.stderr,
        "stdin": sys.stdin,
        "argv": sys.__dict__.get("argv", MISSING),
        "main": sys.modules.get("__main__", MISSING),
        "underscore": builtins.__dict__.get("_", MISSING),
        "linecache": linecache.cache.get(_program.SOURCE_FILENAME, MISSING),
    }


def restore_interpreter_state(saved):
    sys.stdout = saved["stdout"]
    sys.stderr = saved["stderr"]
    sys.stdin = saved["stdin"]
    restore_item(sys.__dict__, "argv", saved["argv"])
    restore_item(sys.modules, "__main__", saved["main"])
    restore_item(builtins.__dict__, "_", saved["underscore"])
    restore_item(linecache.cache, _program.SOURCE_FILENAME, saved["linecache"])


def restore_item(mapping, key, value):
    if value is MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = value
