"""Describes a session's variables for ``GET /v1/sessions/{id}``: names, types, short reprs
and shapes, computed without calling ``__repr__`` of user classes (which could run forever
or print huge values).

Loaded by the zygote as the module ``_snakecage_variables`` after ``display.py``, whose
type checks it shares; the runner imports it. Only the standard library is imported at
module level; numpy and pandas are looked up in ``sys.modules`` when a value might be
theirs.
"""

import reprlib
import time
import types

from _snakecage_alarm import Alarm, TooSlow
from _snakecage_display import is_instance

MAX_VARIABLES = 500
"""Variables listed per session; the rest are counted, not listed."""

VARIABLE_SECONDS = 0.1
"""The longest describing one variable may take (a ``__class__`` property that sleeps,
say); past it the variable is listed without a description, and so is every later value
of its type, at once."""

LISTING_SECONDS = 1.0
"""The longest describing all of them may take; past it the rest are listed by name and
type only."""

_SLOW_TYPES_KEPT = 256

REPR_CHARS = 100
"""The longest ``repr`` a variable listing gives."""


class _BoundedRepr(reprlib.Repr):
    """reprlib with user-defined ``__repr__`` never called: only builtin values are shown."""

    def __init__(self):
        super().__init__()
        self.maxlevel = 3
        self.maxstring = 60
        self.maxother = 60

    def repr_instance(self, x, level):
        return _opaque_repr(x)


_BOUNDED_REPR = _BoundedRepr()
_SAFE_REPR_TYPES = (int, float, complex, bool, type(None), bytes, range, type(Ellipsis))


def _opaque_repr(x):
    cls = type(x)
    if cls in _SAFE_REPR_TYPES or cls.__module__ == "builtins" and not hasattr(x, "__dict__"):
        try:
            return _cut(repr(x))  # a builtin type's repr: bounded by reprlib's caller
        except Exception:
            pass
    if isinstance(x, type):
        return "<class '%s.%s'>" % (x.__module__, x.__qualname__)
    if isinstance(x, types.FunctionType):
        return "<function %s>" % x.__qualname__
    return "<%s.%s object>" % (cls.__module__, cls.__qualname__)


def describe(name, value):
    """``{"name", "type", "repr", "shape"?}`` for one variable, without user code."""
    cls = type(value)
    entry = {"name": name, "type": cls.__name__}
    shape = _shape(value)
    if shape is not None:
        entry["shape"] = shape
    if is_instance(value, "pandas", "DataFrame"):
        text = "DataFrame with %d rows × %d columns" % tuple(shape)
    elif is_instance(value, "pandas", "Series"):
        text = "Series of %d %s values" % (shape[0], value.dtype)
    elif is_instance(value, "numpy", "ndarray"):
        text = "ndarray of shape %s, dtype %s" % (tuple(shape), value.dtype)
    elif type(value).__name__ == "module":
        text = "<module '%s'>" % getattr(value, "__name__", name)
    else:
        try:
            text = _BOUNDED_REPR.repr(value)
        except Exception:
            text = _opaque_repr(value)
    entry["repr"] = _cut(text)
    return entry


def _shape(value):
    for module, name in (("numpy", "ndarray"), ("pandas", "DataFrame"), ("pandas", "Series")):
        if is_instance(value, module, name):
            return [int(n) for n in value.shape]
    return None


def _cut(text):
    return text if len(text) <= REPR_CHARS else text[: REPR_CHARS - 1] + "…"


def variables(namespace):
    """The user globals of ``namespace`` (names not starting with ``_``), bounded.

    Returns ``(entries, total)``: at most ``MAX_VARIABLES`` descriptions and how many user
    globals there are. A name is read as the plain ``str`` it holds (a ``str`` subclass's
    methods are never called), and a value whose description raises (an ``isinstance``
    check can run user code: a ``__class__`` property) is listed without one: listing never
    fails, so it never costs the session its worker. Describing is timed
    (``VARIABLE_SECONDS`` each, ``LISTING_SECONDS`` in all), so one slow value neither
    hides the others nor delays every run of the session.
    """
    entries = []
    total = 0
    deadline = time.monotonic() + LISTING_SECONDS
    with Alarm() as alarm:
        for name, value in list(namespace.items()):
            if not isinstance(name, str):
                continue
            name = str.__str__(name)
            if name.startswith("_"):
                continue
            total += 1
            if len(entries) < MAX_VARIABLES:
                entries.append(_describe_in_time(name, value, alarm, deadline))
    return entries, total


def _describe_in_time(name, value, alarm, deadline):
    cls = type(value)
    if cls in _slow_types or time.monotonic() >= deadline:
        return _not_described(name, value, "too slow to describe")
    try:
        alarm.arm(VARIABLE_SECONDS)
        try:
            return describe(name, value)
        finally:
            alarm.disarm()
    except (TooSlow, KeyboardInterrupt):
        # Ours, or the supervisor's interrupt of an overdue listing (a value stuck where
        # no signal handler runs): either way this value is not worth waiting for again.
        if len(_slow_types) < _SLOW_TYPES_KEPT:
            _slow_types.add(cls)
        return _not_described(name, value, "too slow to describe")
    except BaseException as exc:
        return _undescribable(name, value, exc)


_slow_types = set()
"""Types a value of which took too long to describe: later listings skip them at once."""


def _not_described(name, value, why):
    return {"name": name, "type": _type_name(value), "repr": "<not described: %s>" % why}


def _undescribable(name, value, exc):
    return _not_described(name, value, _type_name(exc))


def _type_name(obj):
    """The name of ``obj``'s class, read past any ``__name__`` its metaclass defines."""
    return type.__dict__["__name__"].__get__(type(obj))
