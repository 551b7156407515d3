"""The ``dlrun`` console script (and ``python -m dlrun``): the CLI is imported inside a guard, so
Ctrl-C while numpy, rich and the registries load (a few hundred milliseconds) ends with one line
and exit code 130, as it does once the command runs, not with a traceback of the import.

SIGINT and SIGTERM outside training (predict, evaluate, check, gradcheck, or while a run is being
prepared) become :class:`Stopped` (see :func:`stop_on_signals`): one line, ``interrupted`` or
``terminated``, and exit code 130 or 143, after the cleanups on the way out have run (predict's
unfinished output file is removed). Training stops at a batch boundary instead, with handlers of
its own (:func:`dlrun.faults.catch_signals`), which put these back when the fit ends.
"""
from __future__ import annotations

import signal
import sys
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


def main() -> None:
    with stop_on_signals():
        try:
            from .cli import main as run
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            sys.exit(130)
        except Stopped as e:
            sys.stderr.write(f"{e.word}\n")
            sys.exit(e.exit_code)
    run()
