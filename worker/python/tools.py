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

A call blocks the calling thread until the tool answers; the run's deadline
keeps running meanwhile.  Arguments are keyword arguments of JSON values,
checked against the tool's JSON Schema before anything is sent; the result is
the tool's JSON answer as Python objects.  An argument or a result may nest
lists and dicts at most ``MAX_JSON_DEPTH`` (64) levels deep: a deeper argument
raises ``ToolLimitError`` before anything is sent, a deeper result raises it
instead of returning.

Calls run concurrently: a waiting call releases the GIL, so the program's
other threads run, and calls from several threads are in flight at once (up
to the service's ``tools.max_concurrent_calls`` per run; a call past it waits
for a free slot).  Fan them out with threads, or with asyncio::

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        temps = list(pool.map(lambda c: tools.get_weather(city=c), cities))

    results = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in cities))
    now = await tools.acall("get_weather", city="Bern")    # the same, by name

``tools.acall`` and ``tools.aio.<name>`` run the blocking call on a small pool
of daemon threads of their own (started on first use, at most as many as the
cap), so the event loop goes on meanwhile; they raise the same ``ToolError``
classes.  A task that stops waiting (``asyncio.wait_for``, ``asyncio.timeout``,
a cancelled ``TaskGroup``) cancels its call, which frees its slot at once.  A
synchronous ``tools.call`` cannot be cancelled: it waits for its answer or the
service's per-call timeout.

Tools whose names are not Python identifiers (``github.search-issues``), or
that share a name with this module's own functions (``search``, ``list``,
``call``, ``acall``, ``aio``), are called by name:
``tools.call("github.search-issues", q="bug")`` or
``await tools.acall("search", q="bug")``.

The Rust zygote executes this file as the module ``snakecage.tools`` inside a
package ``snakecage`` that exists only in ``sys.modules``; the native half,
``_snakecage_tools``, holds this run's tools and carries calls over the job
socket.
"""

import _queue
import _thread
import json as _json
import sys as _sys

import _snakecage_tools as _native

__all__ = [
    "MAX_JSON_DEPTH",
    "ToolError",
    "UnknownToolError",
    "ToolArgumentsError",
    "ToolLimitError",
    "ToolTimeoutError",
    "acall",
    "aio",
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
    """A limit was reached: the number of calls of a run, the size of the
    arguments or of the result, or how deep they nest (``MAX_JSON_DEPTH``)."""


# How deep an argument or a result may nest lists and dicts: [[1]] is 2 levels.
MAX_JSON_DEPTH = _native.MAX_JSON_DEPTH


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
    payload = _encode(name, arguments)
    _flush_output()
    return _decode(name, _native.call(name, payload))


def _encode(name, arguments):
    """The JSON of a call's arguments; raises before anything is sent."""
    if not isinstance(name, str):
        raise TypeError(f"the tool name must be a string, not {type(name).__name__}")
    try:
        return _json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ToolArgumentsError(
            f"arguments of tool '{name}' must be JSON values: {e}",
            tool=name,
            kind="invalid_arguments",
        ) from None
    except RecursionError:
        # Nested thousands of levels: deeper than the encoder goes, and far deeper than
        # a call may carry. The native half measures
        # everything shallower, and names the argument.
        raise ToolLimitError(
            f"arguments of tool '{name}' are nested too deep to be encoded, deeper than the "
            f"{MAX_JSON_DEPTH} levels a tool's arguments and results may nest (arrays and "
            "objects within one another); flatten them, or pass them as a JSON string",
            tool=name,
            kind="limit",
        ) from None


def _decode(name, answer):
    """The result in the JSON ``answer`` to a call, or its ``ToolError`` raised."""
    answer = _json.loads(answer)
    if answer["status"] == "ok":
        return answer["result"]
    kind = answer.get("kind", "failed")
    error = _ERRORS.get(kind, ToolError)
    raise error(answer.get("message", ""), data=answer.get("data"), tool=name, kind=kind)


# The threads ``acall`` runs calls on: started on first use, never in the zygote,
# at most as many as the run's cap. Their queue's module (``_queue``, small, it imports
# nothing) is imported with this one: an import on first use, in a run whose memory is
# used up, failed with ``OSError`` (ENOMEM) instead of the call's own error. The
# native half starts them, each with a small stack of its own (``threading``'s
# stack size is the process's: 8 MiB, and ~30 of those filled the run's memory
# limit). They are not ``threading`` threads, and daemons in effect: a one-shot
# run ends when its program does, as it would without them (the runner waits for
# the non-daemon threads a program leaves). They run no user code and only
# native code of the call: the JSON is made and read on the event loop's thread.
_pool_lock = _thread.allocate_lock()
_pool_queue = None
_pool_threads = 0
_pool_idle = 0


def _pool_worker(started):
    global _pool_idle, _pool_threads
    started()  # the native half waits for this before it starts another
    try:
        while True:
            work = _pool_queue.get()
            work()
            del work
            with _pool_lock:
                _pool_idle += 1
    finally:
        # A thread that dies (a MemoryError out of its loop) is not counted as one that
        # serves: the next call starts another.
        with _pool_lock:
            _pool_threads -= 1


def _submit(work, name):
    """Runs ``work()`` on a thread of the pool: an idle one, a new one below the
    cap, or the next one free. A thread that cannot start raises
    ``ToolLimitError`` and ``work`` never runs."""
    global _pool_queue, _pool_threads, _pool_idle
    with _pool_lock:
        if _pool_queue is None:
            _pool_queue = _queue.SimpleQueue()
        if _pool_idle > 0:
            _pool_idle -= 1
        elif _pool_threads < max(1, _native.max_concurrent_calls()):
            try:
                _native.start_thread(_pool_worker, f"snakecage-tools-{_pool_threads + 1}")
            except RuntimeError as e:
                raise ToolLimitError(
                    f"tool '{name}' was not called: no thread could be started for it "
                    f"({e}): the run's memory or thread limit is reached; make fewer "
                    "calls at once",
                    tool=name,
                    kind="limit",
                ) from None
            _pool_threads += 1
        _pool_queue.put(work)


def _settle(future, answer, error):
    if future.done():  # the awaiting task was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(answer)


async def acall(name, /, **arguments):
    """``await tools.acall(name, **arguments)``: ``call`` for asyncio code.

    The call runs on a thread of a small pool, so the event loop (and every
    other task) goes on while it waits; fan calls out with
    ``asyncio.gather``.  Raises the same ``ToolError`` classes as ``call``.
    A task that stops waiting (cancelled: ``asyncio.wait_for``,
    ``asyncio.timeout``, a ``TaskGroup``) cancels the call: one not sent yet
    never is, one in flight is dropped by the host, and its slot is free again.
    """
    payload = _encode(name, arguments)
    import asyncio

    loop = asyncio.get_running_loop()
    ticket = _native.prepare(name, payload)
    if isinstance(ticket, str):  # refused before sending: unknown tool, bad arguments
        return _decode(name, ticket)
    future = loop.create_future()

    def work():
        try:
            answer, error = ticket.wait(), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            answer, error = None, e
        try:
            loop.call_soon_threadsafe(_settle, future, answer, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    _flush_output()
    _submit(work, name)
    try:
        answer = await future
    except BaseException:
        # Cancelled, or its coroutine closed: the call is withdrawn (a no-op once
        # it has its answer), which frees its slot.
        ticket.cancel()
        raise
    return _decode(name, answer)


def _known(name):
    """Raises UnknownToolError unless this run offers a tool ``name``."""
    if not any(t["name"] == name for t in list()):
        raise UnknownToolError(
            f"unknown tool '{name}'; tools.list() shows the tools of this run",
            tool=name,
            kind="unknown_tool",
        )


class _Aio:
    """``tools.aio.<name>(**kwargs)`` is ``tools.acall("<name>", **kwargs)``: the
    tools of this run as coroutine functions (every tool whose name is a
    Python identifier, ``search`` and ``list`` included)."""

    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _known(name)

        async def tool(**arguments):
            return await acall(name, **arguments)

        tool.__name__ = name
        tool.__qualname__ = f"aio.{name}"
        return tool

    def __dir__(self):
        return sorted(t["name"] for t in list() if t["name"].isidentifier())

    def __repr__(self):
        return "<snakecage.tools.aio: await tools.aio.<name>(**arguments)>"


aio = _Aio()


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
    _known(name)

    def tool(**arguments):
        return call(name, **arguments)

    tool.__name__ = name
    tool.__qualname__ = name
    return tool


def __dir__():
    return sorted(set(__all__) | {t["name"] for t in list() if t["name"].isidentifier()})
