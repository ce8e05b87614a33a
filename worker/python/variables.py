"""Describes a session's variables for ``GET /v1/sessions/{id}``: names, types, short reprs
and shapes, computed without running code of the user's: no ``__repr__``, ``__eq__``,
``__hash__``, ``__len__``, ``__iter__`` or ``__getattr__`` of a user class, no property, no
``__name__`` a metaclass defines. A user object is looked at only through ``type(x)``, checks
that a type is exactly a builtin one (``type(x) is int``), and the slots of ``type`` itself
(a metaclass cannot override ``type.__dict__['__name__']``), so what a listing shows is
bounded and never changes the session's state.

Loaded by the zygote as the module ``_snakecage_variables`` after ``display.py``; the runner
imports it. Only the standard library is imported; numpy and pandas are looked up in
``sys.modules`` when a value might be theirs.
"""

import itertools
import sys
import time
import types

from _snakecage_alarm import Alarm, TooSlow

MAX_VARIABLES = 500
"""Variables listed per session; the rest are counted, not listed."""

LISTING_CHARS = 50_000
"""The most characters of names, types and reprs one listing gives, all variables together;
the variables past it are counted, not listed."""

NAME_CHARS = 100
"""The longest variable name a listing gives (longer ones are cut, ending in ``…``)."""

TYPE_CHARS = 100
"""The longest type name a listing gives."""

REPR_CHARS = 100
"""The longest ``repr`` a variable listing gives."""

VARIABLE_SECONDS = 0.1
"""The longest describing one variable may take (a ``__class__`` property that sleeps,
say); past it the variable is listed without a description, and so is every later value
of its type, at once."""

LISTING_SECONDS = 1.0
"""The longest describing all of them may take; past it the rest are listed by name and
type only."""

_SLOW_TYPES_KEPT = 256

_ITEMS_SHOWN = 6
"""Items of a list, tuple, set or dict a repr shows before ``…``."""

_DEPTH_SHOWN = 3
"""Nesting a repr shows before ``[…]``."""

_STRING_SHOWN = 60
"""Characters of a ``str`` or ``bytes`` value a repr quotes."""

_INT_BITS_SHOWN = 512
"""An ``int`` wider than this is shown by its size (its digits would be cut anyway, and
converting a huge one costs time, or raises past ``sys.set_int_max_str_digits``)."""

# The slots of ``type`` and ``function`` themselves: reading a name through these never
# looks at the class's metaclass or its ``__dict__`` (whose ``__module__`` lookup could
# compare a user key's ``__eq__``), and a user class cannot replace them.
_type_name_slot = type.__dict__["__name__"].__get__
_type_qualname_slot = type.__dict__["__qualname__"].__get__
_type_mro_slot = type.__dict__["__mro__"].__get__
_type_flags_slot = type.__dict__["__flags__"].__get__
_type_dict_slot = type.__dict__["__dict__"].__get__
_function_qualname_slot = types.FunctionType.__dict__["__qualname__"].__get__
_module_dict_slot = types.ModuleType.__dict__["__dict__"].__get__

_NOTHING = object()
"""What no value's type is: the class looked for when it is not imported."""

_HEAPTYPE = 1 << 9
"""``Py_TPFLAGS_HEAPTYPE``: a class made by a ``class`` statement or ``type()``."""

_SCALARS = (int, float, complex, bool, type(None), type(Ellipsis), type(NotImplemented), range)


def _plain(text):
    """``text`` (a ``str``, maybe of a subclass) as a plain ``str``, without its methods."""
    return str.__str__(text) if issubclass(type(text), str) else "?"


def _cut(text, limit=REPR_CHARS):
    return text if len(text) <= limit else text[: limit - 1] + "…"


def type_name(cls):
    """The ``__name__`` a class was given, whatever its metaclass says ``__name__`` is."""
    return _plain(_type_name_slot(cls))


def _module_name(cls):
    """Where ``cls`` was defined, or ``None`` when that is not known without user code.

    A builtin class keeps it in its C name; a class statement puts ``__module__`` first in
    the class's namespace, which is scanned (never looked up: a lookup could compare a user
    key of equal hash) for its first few entries only.
    """
    if not _type_flags_slot(cls) & _HEAPTYPE:
        return type.__dict__["__module__"].__get__(cls)
    namespace = _type_dict_slot(cls)  # a mappingproxy of the class's own exact dict
    for key, value in itertools.islice(namespace.items(), 32):
        if type(key) is str and key == "__module__":
            return _plain(value) if issubclass(type(value), str) else None
    return None


def _class_text(cls):
    module = _module_name(cls)
    qualname = _plain(_type_qualname_slot(cls))
    return qualname if module is None else "%s.%s" % (module, qualname)


def _opaque(x):
    cls = type(x)
    if issubclass(cls, type):
        return "<class '%s'>" % _class_text(x)
    if cls is types.FunctionType:
        return "<function %s>" % _plain(_function_qualname_slot(x))
    return "<%s object>" % _class_text(cls)


def bounded_repr(x, depth=0):
    """A short repr of ``x``: builtin values of exactly builtin types as ``repr`` shows them
    (containers cut), anything else as ``<module.Class object>``."""
    cls = type(x)
    if cls is str or cls is bytes or cls is bytearray:
        shown = repr(x[:_STRING_SHOWN])
        return shown + "…" if len(x) > _STRING_SHOWN else shown
    if cls is int and x.bit_length() > _INT_BITS_SHOWN:
        return "<int of %d bits>" % x.bit_length()
    if any(cls is scalar for scalar in _SCALARS):  # ``in`` would call a metaclass's ``__eq__``
        return repr(x)
    if cls is list or cls is tuple:
        opened, closed = ("[", "]") if cls is list else ("(", ")")
        if depth >= _DEPTH_SHOWN:
            return opened + "…" + closed
        items = [bounded_repr(item, depth + 1) for item in x[:_ITEMS_SHOWN]]
        if len(x) > _ITEMS_SHOWN:
            items.append("…")
        elif cls is tuple and len(x) == 1:
            return "(%s,)" % items[0]
        return opened + ", ".join(items) + closed
    if cls is dict:
        if depth >= _DEPTH_SHOWN:
            return "{…}"
        items = [
            "%s: %s" % (bounded_repr(k, depth + 1), bounded_repr(v, depth + 1))
            for k, v in itertools.islice(dict.items(x), _ITEMS_SHOWN)
        ]
        if len(x) > _ITEMS_SHOWN:
            items.append("…")
        return "{" + ", ".join(items) + "}"
    if cls is set or cls is frozenset:
        if not x:
            return "%s()" % cls.__name__
        if depth >= _DEPTH_SHOWN:
            return "{…}"
        # Iterating an exact set hashes and compares nothing.
        items = [bounded_repr(item, depth + 1) for item in itertools.islice(x, _ITEMS_SHOWN)]
        if len(x) > _ITEMS_SHOWN:
            items.append("…")
        text = "{" + ", ".join(items) + "}"
        return text if cls is set else "frozenset(%s)" % text
    if cls is types.ModuleType:
        return "<module '%s'>" % _module_own_name(x)
    return _opaque(x)


def _module_own_name(module):
    """A module's ``__name__``, from the first entries of its namespace (where the module's
    creation put it), never through a module subclass's ``__getattr__``."""
    for key, value in itertools.islice(dict.items(_module_dict_slot(module)), 8):
        if type(key) is str and key == "__name__":
            return _cut(_plain(value), NAME_CHARS)
    return "?"


_WANTED = {"numpy": ("ndarray",), "pandas": ("DataFrame", "Series")}
"""The classes whose values are described by their shape, by module."""


def _known_classes():
    """``{name: class}`` of the ``_WANTED`` classes of the modules imported so far.

    ``sys.modules`` and the modules' namespaces are scanned, never looked up: a lookup
    compares the key with any key of equal hash, and a job can put a key with a
    hostile ``__eq__`` in either. Once per listing.
    """
    known = {}
    modules = sys.modules
    if type(modules) is not dict:
        return known
    for key, module in list(dict.items(modules)):
        if type(key) is not str or key not in _WANTED or type(module) is not types.ModuleType:
            continue
        wanted = _WANTED[key]
        for name, value in list(dict.items(_module_dict_slot(module))):
            if type(name) is str and name in wanted and type(value) is type:
                known[name] = value
    return known


def _array_description(value, known):
    """``(shape, text)`` for a numpy array (of any subclass, read through ``ndarray``'s own
    slots) or a DataFrame or Series (of exactly that type: a subclass's methods are its
    author's), else ``None``."""
    cls = type(value)
    ndarray = known.get("ndarray")
    if ndarray is not None and any(c is ndarray for c in _type_mro_slot(cls)):
        shape = [int(n) for n in ndarray.__dict__["shape"].__get__(value)]
        dtype = ndarray.__dict__["dtype"].__get__(value)
        return shape, "ndarray of shape %s, dtype %s" % (tuple(shape), dtype)
    if cls is known.get("DataFrame", _NOTHING):
        shape = [int(n) for n in value.shape]
        return shape, "DataFrame with %d rows × %d columns" % tuple(shape)
    if cls is known.get("Series", _NOTHING):
        shape = [int(n) for n in value.shape]
        return shape, "Series of %d %s values" % (shape[0], value.dtype)
    return None


def describe(name, value, known):
    """``{"name", "type", "repr", "shape"?}`` for one variable, without user code;
    ``known``: ``_known_classes()``."""
    entry = {"name": name, "type": _cut(type_name(type(value)), TYPE_CHARS)}
    described = _array_description(value, known)
    if described is not None:
        entry["shape"], text = described
    else:
        text = bounded_repr(value)
    entry["repr"] = _cut(text)
    return entry


def variables(namespace):
    """The user globals of ``namespace`` (names not starting with ``_``), bounded.

    Returns ``(entries, total)``: descriptions of the first of them, at most
    ``MAX_VARIABLES`` and ``LISTING_CHARS`` characters in all, and how many user globals
    there are. A name is read as the plain ``str`` it holds (a ``str`` subclass's methods
    are never called) and cut to ``NAME_CHARS``; a value whose description raises is
    listed without one: listing never fails, so it never costs the session its worker.
    Describing is timed (``VARIABLE_SECONDS`` each, ``LISTING_SECONDS`` in all), so one slow
    value neither hides the others nor delays every run of the session.
    """
    entries = []
    total = 0
    room = LISTING_CHARS
    deadline = time.monotonic() + LISTING_SECONDS
    known = _known_classes()
    with Alarm() as alarm:
        for name, value in list(dict.items(namespace)):
            if not issubclass(type(name), str):
                continue
            name = str.__str__(name)
            if name.startswith("_"):
                continue
            total += 1
            if len(entries) < MAX_VARIABLES and room > 0:
                entry = _describe_in_time(_cut(name, NAME_CHARS), value, known, alarm, deadline)
                room -= len(entry["name"]) + len(entry["type"]) + len(entry["repr"])
                if room >= 0:
                    entries.append(entry)
    return entries, total


def _describe_in_time(name, value, known, alarm, deadline):
    cls = type(value)
    if id(cls) in _slow_types or time.monotonic() >= deadline:
        return _not_described(name, value, "too slow to describe")
    try:
        alarm.arm(VARIABLE_SECONDS)
        try:
            return describe(name, value, known)
        finally:
            alarm.disarm()
    except (TooSlow, KeyboardInterrupt):
        # Ours, or the supervisor's interrupt of an overdue listing (a value stuck where
        # no signal handler runs): either way this value is not worth waiting for again.
        if len(_slow_types) < _SLOW_TYPES_KEPT:
            _slow_types[id(cls)] = cls
        return _not_described(name, value, "too slow to describe")
    except BaseException as exc:
        return _not_described(name, value, type_name(type(exc)))


_slow_types = {}
"""Types a value of which took too long to describe, by ``id`` (a set would hash them,
which a metaclass's ``__hash__`` answers), kept alive so that no other type gets the id:
later listings skip them at once."""


def _not_described(name, value, why):
    kind = _cut(type_name(type(value)), TYPE_CHARS)
    return {"name": name, "type": kind, "repr": _cut("<not described: %s>" % why)}
