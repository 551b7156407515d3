"""The ``dlrun`` console script (and ``python -m dlrun``): the CLI is imported inside a guard, so
Ctrl-C while numpy, rich and the registries load (a few hundred milliseconds) ends with one line
and exit code 130, as it does once the command runs, not with a traceback of the import.

SIGINT and SIGTERM outside training (predict, evaluate, check, gradcheck, or while a run is being
prepared) become :class:`~dlrun.signals.Stopped`: one line, ``interrupted`` or ``terminated``,
and exit code 130 or 143, after the cleanups on the way out have run (predict's unfinished output
file is removed).
"""
from __future__ import annotations

import sys

from .signals import Stopped, stop_on_signals


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
