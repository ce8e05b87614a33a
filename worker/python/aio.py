"""Owns asyncio inside the sandbox: an event loop that needs no socket, and the loop top-level ``await`` runs on.

Loaded by the zygote as the module ``_snakecage_aio`` (code objects named
``snakecage/aio.py``), first of the runner's modules, before any preload.

asyncio's selector loop wakes itself through a ``socket.socketpair()``; the
sandbox allows no new socket (seccomp and the audit hook both refuse it), so
``asyncio.run`` failed before any user code ran.  The loop's self-pipe is made
from ``os.pipe2`` instead: it carries the same single bytes (``call_soon_threadsafe``
wake-ups) through the same ``recv``/``send``/``fileno``/``close`` calls, and
opens nothing a worker could reach the outside with.  Sockets and subprocesses
stay refused: ``asyncio.open_connection`` and ``create_subprocess_exec`` fail
as any socket or process creation does, and so does ``start_server``, which
would otherwise return a server listening nowhere.

The patch is applied where asyncio's ``selector_events`` module is executed:
at once when it is already loaded, otherwise by a finder on ``sys.meta_path``
that wraps that one module's loader (a tier that does not preload asyncio
imports it when a job first asks for it).

Only the standard library is imported here, and not asyncio itself.
"""

import os
import sys

_PATCHED_MODULE = "asyncio.selector_events"
_CO_COROUTINE = 0x0080  # inspect.CO_COROUTINE, without importing inspect


class _PipeEnd:
    """One end of the loop's self-pipe, with the socket methods asyncio calls on it."""

    __slots__ = ("_fd",)

    def __init__(self, fd):
        self._fd = fd

    def fileno(self):
        return self._fd

    def setblocking(self, flag):
        os.set_blocking(self._fd, flag)

    def recv(self, size):
        return os.read(self._fd, size)

    def send(self, data):
        return os.write(self._fd, data)

    def close(self):
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _make_self_pipe(self):
    # BaseSelectorEventLoop._make_self_pipe, with a pipe where it made a socketpair.
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    self._ssock, self._csock = _PipeEnd(read_end), _PipeEnd(write_end)
    self._internal_fds += 1
    self._add_reader(self._ssock.fileno(), self._read_from_self)


def _patch(module):
    module.BaseSelectorEventLoop._make_self_pipe = _make_self_pipe
    base = module.base_events.BaseEventLoop
    if not getattr(base.create_server, "snakecage_aio", False):
        base.create_server = _refusing_create_server(base.create_server)


def _refusing_create_server(create_server):
    """``create_server`` skips an address whose socket cannot be made (it takes the
    failure for an unsupported family) and may return a server listening nowhere, which
    a program would take for a server that works. Here no socket can be made: such a
    server is closed and the sandbox's own refusal raised, as a client connection gets."""

    async def refusing(self, *args, **kwargs):
        server = await create_server(self, *args, **kwargs)
        if not server.sockets:
            server.close()
            import socket

            socket.socket().close()  # raises the sandbox's refusal; outside one, nothing
        return server

    refusing.__doc__ = create_server.__doc__
    refusing.__name__ = refusing.__qualname__ = "create_server"
    refusing.snakecage_aio = True
    return refusing


class _PatchingLoader:
    """Executes the real loader's module, then patches it."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder:
    """Finds ``asyncio.selector_events`` through the other finders and wraps its loader."""

    snakecage_aio = True  # marks this finder (and one of an earlier load of this file)

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != _PATCHED_MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if getattr(finder, "snakecage_aio", False) or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install():
    """Make every selector event loop of this interpreter use a pipe to wake itself."""
    module = sys.modules.get(_PATCHED_MODULE)
    if module is not None:
        _patch(module)
        return
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "snakecage_aio", False)]
    sys.meta_path.insert(0, _Finder)


install()


# --------------------------------------------------------------------------
# Top-level await


def is_coroutine_code(code):
    """Whether ``code`` (compiled with top-level ``await`` allowed) awaits at top level."""
    return code is not None and bool(code.co_flags & _CO_COROUTINE)


class Loop:
    """The event loop a job's top-level ``await`` runs on: one per one-shot job, closed
    with it (its tasks cancelled, as ``asyncio.run`` does), or one per session, kept
    between jobs so that tasks a job started go on in the next one that awaits.

    ``asyncio.Runner`` turns the supervisor's SIGINT into a cancellation of the job's
    coroutine, so ``finally`` blocks and ``async with`` exits run before the job ends
    with ``KeyboardInterrupt``. However a job ends, its own coroutine ends with it: one
    left pending (the loop stopped, or a task's ``SystemExit`` escaped it) is cancelled,
    so the rest of a failed job never runs during a later one.
    """

    def __init__(self):
        self._runner = None

    def run(self, body, last, namespace, filename):
        """Run ``body`` then ``last`` (either may be a coroutine's code) in ``namespace``."""
        import asyncio

        if self._runner is None:
            self._runner = asyncio.Runner()
        started = []
        try:
            return self._runner.run(_program(body, last, namespace, started))
        except KeyboardInterrupt as exc:
            _point_at_user_code(exc, filename)
            raise
        except BaseException as exc:
            exc.__traceback__ = _from_first_frame_of(exc.__traceback__, filename)
            raise
        finally:
            if started and not started[0].done():
                self._cancel(started[0])
            if started and started[0].done() and not started[0].cancelled():
                # Reported above already; unretrieved, the task would log it again as
                # "Task exception was never retrieved" when collected, during a later job.
                started[0].exception()

    def _cancel(self, task):
        """Cancel the job's own coroutine and let it unwind (its ``finally`` blocks). The
        job is ending with an exception already; what the unwinding raises, an interrupt
        included, ends it no differently."""
        import asyncio

        task.cancel()
        try:
            self._runner.get_loop().run_until_complete(asyncio.wait([task]))
        except BaseException:
            pass

    def close(self, *, one_shot=False):
        """Cancel what is left running and close the loop (a no-op when none was made).

        After a one-shot job, asyncio's global event loop policy is reset as well: the
        runner set and unset the thread's loop, after which ``asyncio.get_event_loop()``
        refuses to make one, and a warm-up's loop must not change what a job sees.
        """
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            runner.close()
        finally:
            if one_shot:
                import asyncio

                asyncio.set_event_loop_policy(None)


async def _program(body, last, namespace, started):
    import asyncio

    started.append(asyncio.current_task())
    for code in (body, last):
        if code is not None:
            outcome = eval(code, namespace)
            if is_coroutine_code(code):
                await outcome


def _first_frame_of(tb, filename):
    """The first entry of ``tb`` in the job's code, or None."""
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return tb


def _from_first_frame_of(tb, filename):
    """``tb`` from the first frame of the job's code on: the loop's own frames (the
    runner's ``run_until_complete``, the task's step) come before it and say nothing.
    Unchanged when no frame of the job's code is in it."""
    first = _first_frame_of(tb, filename)
    return first if first is not None else tb


def _point_at_user_code(exc, filename):
    """An interrupted coroutine ends in ``CancelledError``, which ``asyncio.Runner``
    replaces with a bare ``KeyboardInterrupt``; give that the place the job was
    interrupted (the cancellation's frames) and leave the cancellation out, so it reads
    like an interrupt of synchronous code."""
    own = _first_frame_of(exc.__traceback__, filename)
    if own is not None:
        # Raised in the job's code by a second SIGINT: through asyncio's handler, whose
        # frame ends the traceback where CPython's own handler (C) leaves none.
        exc.__traceback__ = own
        last = own
        while last.tb_next is not None and last.tb_next.tb_next is not None:
            last = last.tb_next
        if last.tb_next is not None and last.tb_next.tb_frame.f_code.co_name == "_on_sigint":
            last.tb_next = None
        return
    cancelled = exc.__context__
    where = None
    if cancelled is not None and type(cancelled).__name__ == "CancelledError":
        where = _first_frame_of(cancelled.__traceback__, filename)
    # Without a frame of the job's (a coroutine that ignored its cancellation, a
    # blocking call), the loop's own frames would be all there is to show: none is.
    exc.__traceback__ = where
    exc.__suppress_context__ = True
