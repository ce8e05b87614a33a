"""Host tools for sandboxed code: ``from snakecage import tools``.

The sandbox has no network and no other way out; the tools the service offers
this run are its only reach beyond the process.  Find them, then call them::

    from snakecage import tools

    for t in tools.search("weather"):        # best matches first
        print(t["name"], t["description"], t["parameters"])
    now = tools.call("get_weather", city="Zürich")
    now = tools.get_weather(city="Zürich")   # the same call
    try:
        tools.get_weather(city="Atlantis")
    except tools.ToolError as e:
        print(e.message, e.data)

A call blocks the program until the tool answers; the run's deadline keeps
running meanwhile.  Arguments are keyword arguments of JSON values, checked
against the tool's JSON Schema before anything is sent; the result is the
tool's JSON answer as Python objects.

The Rust zygote executes this file as the module ``snakecage.tools`` inside a
package ``snakecage`` that exists only in ``sys.modules``; the native half,
``_snakecage_tools``, holds this run's tools and carries calls over the job
socket.
"""

import json as _json
import sys as _sys

import _snakecage_tools as _native

__all__ = [
    "ToolError",
    "UnknownToolError",
    "ToolArgumentsError",
    "ToolLimitError",
    "ToolTimeoutError",
    "call",
    "list",
    "search",
]


class ToolError(Exception):
    """A tool call failed.  ``message`` says why, ``data`` is what the tool
    returned with its error (or None), ``tool`` is its name and ``kind`` one
    of ``failed``, ``unknown_tool``, ``invalid_arguments``, ``limit``,
    ``timeout``, ``cancelled``, ``unavailable``."""

    def __init__(self, message, data=None, tool=None, kind="failed"):
        super().__init__(message)
        self.message = message
        self.data = data
        self.tool = tool
        self.kind = kind


class UnknownToolError(ToolError, AttributeError):
    """No tool of that name is offered to this run."""


class ToolArgumentsError(ToolError, TypeError):
    """The arguments do not match the tool's schema (or are not JSON)."""


class ToolLimitError(ToolError):
    """A per-run limit was reached: number of calls, argument or result size."""


class ToolTimeoutError(ToolError, TimeoutError):
    """The tool did not answer within the per-call timeout."""


_ERRORS = {
    "unknown_tool": UnknownToolError,
    "invalid_arguments": ToolArgumentsError,
    "limit": ToolLimitError,
    "timeout": ToolTimeoutError,
}


def list():  # noqa: A001 - the documented name
    """Every tool offered to this run: ``[{"name", "description", "parameters"}]``."""
    return _json.loads(_native.catalog())


def search(query, limit=10):
    """The tools whose name, description or parameters match the words of
    ``query``, best first (at most ``limit``)."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, not {type(query).__name__}")
    if not isinstance(limit, int) or limit < 0:
        raise ValueError("limit must be a non-negative integer")
    return _json.loads(_native.search(query, limit))


def call(name, /, **arguments):
    """Call the tool ``name`` with keyword ``arguments``; returns its result.

    Raises ``ToolError`` (or a subclass) when the call fails.
    """
    if not isinstance(name, str):
        raise TypeError(f"the tool name must be a string, not {type(name).__name__}")
    try:
        payload = _json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ToolArgumentsError(
            f"arguments of tool '{name}' must be JSON values: {e}",
            tool=name,
            kind="invalid_arguments",
        ) from None
    _flush_output()
    answer = _json.loads(_native.call(name, payload))
    if answer["status"] == "ok":
        return answer["result"]
    kind = answer.get("kind", "failed")
    error = _ERRORS.get(kind, ToolError)
    raise error(answer.get("message", ""), data=answer.get("data"), tool=name, kind=kind)


def _flush_output():
    # What the program printed before the call reaches the client before the call does.
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a replaced or closed stream is the program's business
            pass


def __getattr__(name):
    """``tools.<name>(**kwargs)`` is ``tools.call("<name>", **kwargs)``."""
    if name.startswith("__"):
        raise AttributeError(name)
    if not any(t["name"] == name for t in list()):
        raise UnknownToolError(
            f"unknown tool '{name}'; tools.list() shows the tools of this run",
            tool=name,
            kind="unknown_tool",
        )

    def tool(**arguments):
        return call(name, **arguments)

    tool.__name__ = name
    tool.__qualname__ = name
    return tool


def __dir__():
    return sorted(set(__all__) | {t["name"] for t in list() if t["name"].isidentifier()})
