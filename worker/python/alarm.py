"""Owns the runner's own time limits: a ``SIGALRM`` timer that raises into the runner's work
(describing a session's variables, drawing the figures a job left open) when it runs out
of time.

Loaded by the zygote as the module ``_snakecage_alarm``, first of the runner's modules:
it imports only the standard library.
"""

import signal
import sys

REPEAT_SECONDS = 0.05
"""How often an alarm that went off raises ``TooSlow`` again: often, as the first may have
been caught (or landed where exceptions are ignored), yet with time between for the code
that caught one to disarm."""


class TooSlow(BaseException):
    """Raised into work that ran out of time (``BaseException``: user code that catches
    ``Exception`` around a sleep, or a ``__repr__`` that does, does not swallow it)."""


class Alarm:
    """A repeating ``SIGALRM`` timer that raises ``TooSlow`` while armed.

    It repeats because user code may catch one, and because one may land in a callback
    whose exceptions CPython ignores (a weakref's, a ``__del__``): those are not printed
    (``sys.unraisablehook``) while the alarm is set. The handler raises only while armed,
    so a signal delivered just as the timed work ends is ignored; a timer or hook or
    handler the job set is put back on exit. Outside the main thread no handler can be
    set: the work is untimed there (the supervisor's deadline still bounds it).
    """

    def __init__(self):
        self._armed = False
        self._usable = False

    def __enter__(self):
        try:
            self._handler = signal.signal(signal.SIGALRM, self._fire)
        except ValueError:
            return self  # not the main thread
        self._usable = True
        self._timer = signal.setitimer(signal.ITIMER_REAL, 0)
        self._unraisablehook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def __exit__(self, *exc):
        if not self._usable:
            return
        self.disarm()
        sys.unraisablehook = self._unraisablehook
        signal.signal(signal.SIGALRM, self._handler)
        if self._timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *self._timer)

    def _unraisable(self, unraisable):
        if not isinstance(unraisable.exc_value, TooSlow):
            self._unraisablehook(unraisable)

    def arm(self, seconds):
        """Raise ``TooSlow`` in ``seconds``, then every ``REPEAT_SECONDS`` until disarmed."""
        if self._usable:
            self._armed = True
            signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_SECONDS)

    def disarm(self):
        if self._usable:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _fire(self, signum, frame):
        if self._armed:
            raise TooSlow
