"""The command line. Each command parses its arguments and calls a library function; this
package (and dlrun.cli.progress) is the only code that prints.

Exit codes: 0 success, 1 the run failed, 2 bad usage, config or input.
"""
from __future__ import annotations

import errno
import io
import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import typer

try:  # recent typer vendors click as typer._click; older releases use click itself
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError as ClickUsageError
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError as ClickUsageError
from rich.console import Console
from rich.markup import escape

from .. import __version__, parallel
from ..backend import threads
from ..signals import Stopped, stop_on_signals
from ..errors import ConfigErrors, DlrunError, Interrupted, UsageError
from ..registry.plugins import blame
from ..runs import checkpoint
from ..training.position import EpochPosition

# click's plain help layout: it shows a flag as a flag (``--proba``), where typer's panels print
# ``--proba <bool>`` for every boolean option, --help included
app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Train, gradient-check and use neural networks defined in YAML.")


class _Stream:
    """sys.stdout or sys.stderr (looked up at each write, as pytest's capture needs), where a
    reader that went away (`dlrun train x.yaml | head -1`) silences the output instead of
    stopping the command: the run goes on to its end, as it would written to a file, and
    leaves a whole run directory. The stream's descriptor is pointed at /dev/null, so the
    interpreter's own flush at exit finds no broken pipe either (Python's documented remedy)."""

    def __init__(self, name: str):
        self._name = name

    def _stream(self):
        return getattr(sys, self._name)

    def write(self, text: str) -> int:
        try:
            return self._stream().write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream().flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream().fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name):  # isatty, fileno, encoding: the stream's own
        return getattr(self._stream(), name)


# soft_wrap: lines (paths, error messages, resume commands) are never broken by inserted
# newlines, so they copy-paste whole at any terminal width; tables still fit the width
out = Console(file=_Stream("stdout"), highlight=False, soft_wrap=True)
err = Console(file=_Stream("stderr"), highlight=False, soft_wrap=True)


_argv: list[str] = []


def debug_enabled() -> bool:
    return "--debug" in (_argv or sys.argv) or os.environ.get("DLRUN_DEBUG") == "1"


def _show_version(value: bool) -> None:
    if value:
        out.print(f"dlrun {__version__}", markup=False, highlight=False)
        raise typer.Exit(0)


THREADS_HELP = (f"BLAS threads for the CPU's matrix products (default: ${threads.ENV}, else the BLAS library's own "
                f"variable such as OMP_NUM_THREADS, else {threads.DEFAULT}; see docs/performance.md).")


def _count(value) -> Optional[int]:
    """--threads N (or $DLRUN_THREADS) as a whole number >= 1."""
    if value is None:
        return None
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise typer.BadParameter(f"expected a whole number of threads >= 1, got {value!r}")
    return int(text)


THREADS = typer.Option(None, "--threads", metavar="N", callback=_count, help=THREADS_HELP)  # (the commands that compute)


def use_threads(n: int | None) -> None:
    """A command's own --threads N, given after the command's name (the root's applies otherwise)."""
    if n is not None:
        threads.limit(n)


@app.callback()
def _root(ctx: typer.Context, debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
          threads_: Optional[str] = typer.Option(None, "--threads", envvar=threads.ENV, metavar="N",
                                                 callback=_count, help=THREADS_HELP),
          version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="Print dlrun's version and exit.")) -> None:
    """dlrun: declarative deep-learning runs on numpy (CPU) and CuPy (GPU)."""
    threads.limit(threads_)
    _, size, var = parallel.launched()
    if size > 1 and ctx.invoked_subcommand != "train":  # started by mpiexec -n K: only training runs on K ranks
        e = UsageError(f"dlrun {ctx.invoked_subcommand} runs in one process, but this is one of {size} processes "
                       f"started by mpiexec ({var}={size}); run it without mpiexec (dlrun train alone runs on several)")
        e.everywhere = True
        raise e


def fail(e: DlrunError) -> int:
    """Print an error as lines of 'error: ...' on stderr and return its exit code."""
    label = "interrupted" if isinstance(e, Interrupted) else "error"
    for i, line in enumerate(str(e).splitlines() or [type(e).__name__]):
        # several config problems: one 'error:' each; one error over several lines: indent the rest
        head = f"[bold red]{label}:[/]" if i == 0 or isinstance(e, ConfigErrors) else " "
        err.print(f"{head} {escape(line)}", markup=True, highlight=False, soft_wrap=True)
    return e.exit_code


class _Kept(io.StringIO):
    """What a rank of several says on stderr, kept until it ends (:func:`_rank_ends` decides
    what is shown); rank 0's warnings (``shown``: its stderr) are shown at once, as in one process."""

    def __init__(self, shown=None):
        super().__init__()
        self.shown = shown

    def write(self, text: str) -> int:
        if self.shown is not None and text.startswith("warning:"):
            self.shown.write(text)
            self.shown.flush()
            return len(text)
        return super().write(text)


_kept: list[_Kept] = []  # a rank of several: what it has said so far (written when it ends)


def report_lost(lost: parallel.LostRank) -> None:
    """Report a rank of a data-parallel run that ended while the others waited for it (called by
    the watch of :mod:`dlrun.parallel`, in its thread, before it stops every rank): what this
    rank has said so far, then one line naming the rank, then the checkpoint to resume from."""
    where = f" during {lost.where}" if lost.where else ""
    lines = [f"error: rank {lost.rank} of {lost.size} ended ({lost.how}){where}; stopping all ranks"]
    if lost.run_dir is not None:
        lines.append(_resume_from(Path(lost.run_dir), lost.size))
    said = _kept[0].getvalue() if _kept else ""
    sys.stderr.write(said + "\n".join(lines) + "\n")
    sys.stderr.flush()


def _resume_from(run_dir: Path, ranks: int) -> str:
    """Where a run stopped by a lost rank resumes: its last checkpoint (written whole, or not at all)."""
    path = run_dir / "checkpoints" / "last.npz"
    try:
        meta = checkpoint.read_meta(path)
        at = EpochPosition.from_meta(meta.get("position"), str(path)) or f"epoch {meta['epoch']}"
    except (DlrunError, KeyError, OSError):
        return "no checkpoint was written, so the run cannot be resumed (its metrics.csv keeps the epochs run)"
    return f"the last checkpoint ({at}) is {path}; resume with: mpiexec -n {ranks} dlrun train --resume {run_dir}"


from . import catalog, check, configs, evaluate, gradcheck, plot, predict, runs, time, train  # noqa: E402,F401  (commands register on import)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the app and maps every outcome to an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in args:  # accepted anywhere (`dlrun train x.yaml --debug`), as the root option
        args = ["--debug"] + [a for a in args if a != "--debug"]
    _argv[:] = args
    rank, size, _ = parallel.launched()
    if size == 1:
        _main(args)
        return
    # one of several ranks (mpiexec): what it reports is decided when it ends (see _rank_ends)
    shown = err.file
    kept = _Kept(shown if rank == 0 else None)
    err.file = kept
    _kept[:] = [kept]
    try:
        _main(args)
    except SystemExit as e:
        err.file = shown
        _rank_ends(e, kept.getvalue(), rank)
        raise
    finally:
        err.file = shown


def _rank_ends(e: SystemExit, said: str, rank: int) -> None:
    """How a rank of a data-parallel run ends. Errors every rank met together (preparing the
    run, a stop on a signal or a non-finite value they agreed on), and anything said by a rank
    that ends well, are reported by rank 0 alone. An error of this rank's own, which the others
    cannot know of (they wait for it inside a collective), is reported in one line naming the
    rank, and stops every rank of the run (MPI_Abort)."""
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    cause = e.__context__
    world = parallel.current()
    if code == 0 or world.size == 1 or getattr(cause, "everywhere", False) or isinstance(cause, typer.Exit):
        if rank == 0:
            sys.stderr.write(said)
            sys.stderr.flush()
        return
    lines = said.splitlines() or [f"error: exit code {code}"]
    label, colon, rest = lines[0].partition(": ")
    first = f"{label}: rank {rank}: {rest}" if colon else f"{lines[0]} (rank {rank})"
    sys.stderr.write("\n".join([first] + (lines[1:] if rank == 0 else [])) + "\n")
    sys.stderr.flush()
    world.abort(code)


def _main(args: list[str]) -> None:
    """Run the app on ``args``; every outcome ends in sys.exit with its exit code."""
    try:
        _run(args)
    finally:
        threads.restore()  # (the BLAS pools as they were: the test suite runs commands in its own process)


def _run(args: list[str]) -> None:
    """Run the app on ``args`` and exit with the outcome's code."""
    try:
        with stop_on_signals():  # SIGINT/SIGTERM raise Stopped (training catches its own while it fits)
            code = app(args=args, standalone_mode=False, prog_name="dlrun")  # typer.Exit(n) returns n here
    except Stopped as e:  # one line, after the cleanups on the way out (no half-written output file)
        if debug_enabled():
            traceback.print_exc()
        err.print(e.word, markup=False, highlight=False)
        sys.exit(e.exit_code)
    except DlrunError as e:
        if debug_enabled():
            traceback.print_exc()
        sys.exit(fail(e))
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except NoArgsIsHelpError as e:
        err.print(e.format_message(), markup=False)
        sys.exit(2)
    except ClickException as e:
        err.print(f"[bold red]error:[/] {escape(e.format_message())}", soft_wrap=True)
        if isinstance(e, ClickUsageError) and e.ctx is not None:
            err.print(f"  see: {e.ctx.command_path} --help", highlight=False, markup=False)
        sys.exit(e.exit_code)
    except (SystemExit, KeyboardInterrupt) as e:  # raised by a plugin's code: its error, never a silent exit
        named = blame(e)
        if named is not None:
            if debug_enabled():
                traceback.print_exc()
            sys.exit(fail(named))
        if isinstance(e, SystemExit):
            raise
        err.print("interrupted")
        sys.exit(130)
    except typer.Abort:
        err.print("interrupted")
        sys.exit(130)
    except MemoryError as e:  # sizes from the command line or config (--dims N=1e11, units: 1e12)
        if debug_enabled():
            traceback.print_exc()
        err.print(f"[bold red]error:[/] out of memory{': ' + escape(str(e)) if str(e) else ''}; reduce the sizes "
                  "given (batch size, units, --dims)", soft_wrap=True, markup=True)
        sys.exit(2)
    except Exception as e:  # a bug in dlrun or in a plugin: one line unless --debug
        named = blame(e)  # a plugin's own code: name the component and its file:line
        if debug_enabled():
            traceback.print_exc()
        if named is not None:
            sys.exit(fail(named))
        if isinstance(e, OSError) and e.errno in PATH_ERRNOS and e.filename:  # a path given: usage
            name = str(e.filename)
            shown = name if len(name) <= 80 else f"{name[:77]}... ({len(name)} characters)"
            err.print(f"[bold red]error:[/] {escape(shown)}: {escape(e.strerror or str(e))}", soft_wrap=True)
            sys.exit(2)
        if not debug_enabled():
            err.print(f"[bold red]error:[/] internal error: {type(e).__name__}: {escape(str(e))} "
                      "(run with --debug for the traceback)",
                      soft_wrap=True, markup=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


# a path that cannot name a file (too long, a loop of links): the path given is wrong, exit 2
PATH_ERRNOS = {errno.ENAMETOOLONG, errno.ELOOP}
