"""Stopping on SIGINT and SIGTERM outside training: :class:`Stopped`, raised where the program
was, and :func:`stop_on_signals`, which installs it. The console script and the CLI install it;
training stops at a batch boundary instead, with handlers of its own
(:func:`dlrun.training.faults.catch_signals`), which put these back when the fit ends."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """SIGINT or SIGTERM, raised where the program was. A BaseException, like KeyboardInterrupt,
    so that no ``except Exception`` takes it for an error of the code it interrupted."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum
        self.word = "interrupted" if signum == signal.SIGINT else "terminated"


def _raise(signum, frame):
    raise Stopped(signum)


@contextmanager
def stop_on_signals():
    """While active (in the main thread), SIGINT and SIGTERM raise :class:`Stopped`; the handlers
    found are put back at the end. A signal the parent process set to be ignored (a shell's
    background job ignores SIGINT) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s, h in old.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)
