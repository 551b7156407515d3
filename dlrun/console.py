"""The ``dlrun`` console script (and ``python -m dlrun``): the CLI is imported inside a guard, so
Ctrl-C while numpy, rich and the registries load (a few hundred milliseconds) ends with one line
and exit code 130, as it does once the command runs, not with a traceback of the import."""
from __future__ import annotations

import sys


def main() -> None:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run()
