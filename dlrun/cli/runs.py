"""`dlrun runs`: the table of runs in a runs directory, and the config differences of two runs."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ..registry.options import _flow
from ..runs import listing
from . import app, out


@app.command("runs")
def runs_cmd(
    runs_dir: Path = typer.Argument(Path("runs"), metavar="RUNS_DIR",
                                    help="Runs directory (where dlrun train wrote its runs)."),
    sort: str = typer.Option("started", "--sort", metavar="COLUMN",
                             help=f"Sort by a column: {', '.join(listing.COLUMNS)}."),
    reverse: bool = typer.Option(False, "--reverse", help="Sort in descending order."),
    diff: Optional[tuple[str, str]] = typer.Option(None, "--diff", metavar="RUN_A RUN_B",
                                                   help="Show how the resolved configs of two runs differ (run "
                                                        "directories, or names of runs in RUNS_DIR)."),
) -> None:
    """List the runs in RUNS_DIR: config, status, epochs, time, best and final monitored metric.

    Status: finished; stopped early (by early stopping); interrupted (dlrun train --resume RUN continues it);
    failed (it ended without its summary: an error, or the process was killed); running.
    With --diff RUN_A RUN_B: the key paths where the two runs' resolved configs differ.
    """
    if diff is not None:
        _print_diff(*listing.config_diff(diff[0], diff[1], runs_dir))
        return
    records = listing.list_runs(runs_dir, sort, reverse)
    if not records:
        out.print(f"no runs in {escape(str(runs_dir))}")
        return
    monitors = {r.monitor for r in records if r.monitor is not None}
    shared = next(iter(monitors)) if len(monitors) == 1 else None  # one monitor: named in the headers
    t = Table(title=str(runs_dir), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # at 80 columns the names fold (a run's at its time stamp), the figures stay whole
    t.add_column("run", overflow="fold", min_width=16)
    t.add_column("config", overflow="fold", min_width=8)
    t.add_column("status", min_width=8)
    t.add_column("epochs", justify="right", no_wrap=True)
    t.add_column("time", justify="right", no_wrap=True)
    if shared is None:
        t.add_column("monitor", no_wrap=True)
    t.add_column(f"best {escape(shared)}" if shared else "best", justify="right", no_wrap=True)
    t.add_column(f"final {escape(shared)}" if shared else "final", justify="right", no_wrap=True)
    notes = []
    for r in records:
        epochs = "-" if r.epochs is None else f"{r.epochs}/{r.planned if r.planned is not None else '?'}"
        best = "-" if r.best is None else f"{r.best:.4g}" + ("" if r.best_epoch is None else f" @{r.best_epoch}")
        row = [escape(r.name), escape(Path(r.config).stem if r.config else "-"), _STYLE.get(r.status, "") + r.status,
               epochs, _duration(r.seconds)] + ([] if shared else [escape(r.monitor or "-")]) + \
            [best, "-" if r.final is None else f"{r.final:.4g}"]
        t.add_row(*row)
        if r.notes:
            notes.append(f"{r.name}: {', '.join(r.notes)}")
    _print_table(t)
    for n in notes:
        out.print(f"[dim]{escape(n)}[/]")


_STYLE = {"finished": "[green]", "stopped early": "[green]", "interrupted": "[yellow]", "failed": "[red]",
          "running": "[cyan]", "unreadable": "[red]"}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _print_diff(a: Path, b: Path, differences: list) -> None:
    if not differences:
        out.print(f"the resolved configs of {escape(a.name)} and {escape(b.name)} are the same")
        return
    t = Table(title=f"config differences ({len(differences)})", title_justify="left")
    t.add_column("key", overflow="fold")
    t.add_column(escape(a.name), overflow="fold")
    t.add_column(escape(b.name), overflow="fold")
    for key, x, y in differences:
        t.add_row(escape(key), escape(_shown(x)), escape(_shown(y)))
    _print_table(t)


def _print_table(t: Table) -> None:
    """A table at the terminal's width, or whole when the output is a file or pipe (nothing cut)."""
    if out.is_terminal:
        out.print(t)
        return
    for c in t.columns:
        c.no_wrap = True
    wide = Console(file=out.file, highlight=False, soft_wrap=True, width=100_000, no_color=True)
    wide.print(t, width=Measurement.get(wide, wide.options, t).maximum)


def _shown(value) -> str:
    return "(absent)" if value is listing.MISSING else _flow(value)
