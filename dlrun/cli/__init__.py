"""The command line. Each command parses its arguments and calls a library function; this
package (and dlrun.progress) is the only code that prints.

Exit codes: 0 success, 1 the run failed, 2 bad usage, config or input.
"""
from __future__ import annotations

import os
import sys
import traceback

import click
import typer
from rich.console import Console

from ..errors import DlrunError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, gradient-check and use neural networks defined in YAML.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def debug_enabled() -> bool:
    return "--debug" in sys.argv or os.environ.get("DLRUN_DEBUG") == "1"


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors.")) -> None:
    """dlrun: declarative deep-learning runs on numpy (CPU) and CuPy (GPU)."""


def fail(e: DlrunError) -> int:
    """Print an error as lines of 'error: ...' on stderr and return its exit code."""
    for line in str(e).splitlines() or [type(e).__name__]:
        err.print(f"[bold red]error:[/] {line}", markup=True, highlight=False, soft_wrap=True)
    return e.exit_code


from . import catalog, time, train  # noqa: E402,F401  (commands register on import)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        app(args=args, standalone_mode=False, prog_name="dlrun")
    except DlrunError as e:
        if debug_enabled():
            traceback.print_exc()
        sys.exit(fail(e))
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        err.print(f"[bold red]error:[/] {e.format_message()}", soft_wrap=True)
        if isinstance(e, click.UsageError) and e.ctx is not None:
            err.print(f"  see: {e.ctx.command_path} --help", highlight=False)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        err.print("interrupted")
        sys.exit(130)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # a bug in dlrun or in a plugin: one line unless --debug
        if debug_enabled():
            traceback.print_exc()
        else:
            err.print(f"[bold red]error:[/] internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
                      soft_wrap=True)
        sys.exit(1)
    sys.exit(0)
