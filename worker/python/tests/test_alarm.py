"""Tests for worker/python/alarm.py: the runner's own time limits."""

import signal
import sys
import time

from runner_modules import load_module

alarm = load_module("alarm")


class SlowToDelete:
    def __del__(self):
        time.sleep(5)


class FailsToDelete:
    def __del__(self):
        raise ValueError("not ours")


def test_an_alarm_that_lands_where_exceptions_are_ignored_goes_off_again_silently(monkeypatch):
    # The first TooSlow lands in __del__, where CPython ignores exceptions and reports them
    # to sys.unraisablehook (by default: "Exception ignored in ..." on stderr); the next
    # one, soon after, stops the loop. Other exceptions are reported as ever.
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    stopped = False
    with alarm.Alarm() as timer:
        FailsToDelete()
        timer.arm(0.01)
        try:
            SlowToDelete()
            give_up = time.monotonic() + 10
            while time.monotonic() < give_up:
                pass
        except alarm.TooSlow:
            stopped = True
        finally:
            timer.disarm()
    assert stopped
    assert [type(r.exc_value) for r in reported] == [ValueError]
    assert sys.unraisablehook == reported.append
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
