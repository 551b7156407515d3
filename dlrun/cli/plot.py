"""`dlrun plot`: learning curves, decision boundaries and confusion matrices of runs, as PNG or SVG
images (matplotlib, the ``plot`` extra) or, without --output, in the terminal."""
from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from ..errors import TrainingError, UsageError
from ..runs import figures, inference, plots
from ..runs.rundir import FAULTS
from . import app, err, out
from .catalog import PLUGIN
from .chart import COLOURS, fits, line_chart, region_map
from .evaluate import confusion_table
from .restored import BATCH_SIZE, DEVICE, open_trained

MAX_PIXELS = 10_000


class Kind(str, enum.Enum):
    curves = "curves"
    boundary = "boundary"
    confusion = "confusion"


def _size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", text)
    if not m or not all(16 <= int(v) <= MAX_PIXELS for v in m.groups()):
        raise UsageError(f"--size {text}: expected WIDTHxHEIGHT in pixels, each from 16 to {MAX_PIXELS}, "
                         f"e.g. --size 1200x800")
    return int(m[1]), int(m[2])


@app.command("plot")
def plot_cmd(
    runs: list[Path] = typer.Argument(..., metavar="RUN_DIR",
                                      help="Run directories (several: overlaid curves, or one panel each)."),
    kind: Kind = typer.Option(Kind.curves, "--kind", "-k",
                              help="curves: training and validation of each metric and the learning rate, by "
                                   "epoch (metrics.csv); boundary: the classes a model of 2 input features "
                                   "predicts over the plane, with its data; confusion: the confusion matrix of "
                                   "dlrun evaluate."),
    metric: list[str] = typer.Option([], "--metric", "-m", metavar="NAME",
                                     help="Curves of this metric only (loss, accuracy, f1, learning_rate, or a "
                                          "column such as val_loss; repeatable). Default: every metric recorded."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE.png|FILE.svg",
                                          help="Write the picture as PNG or SVG (by the suffix; needs matplotlib). "
                                               "Without it, the picture is drawn in the terminal."),
    size: Optional[str] = typer.Option(None, "--size", metavar="WIDTHxHEIGHT",
                                       help="The image's size in pixels (default: by the number of panels)."),
    data: Optional[str] = typer.Option(None, "--data", metavar="FILE|SPEC",
                                       help="boundary and confusion: this data (as dlrun evaluate --data) instead "
                                            "of the run's (boundary: its training and validation samples; "
                                            "confusion: its validation data, as dlrun evaluate)."),
    batch_size: Optional[int] = BATCH_SIZE,
    device: Optional[str] = DEVICE,
    plugin: list[str] = PLUGIN,
) -> None:
    """Plot runs: learning curves (the default), a decision boundary or a confusion matrix."""
    if output is not None:
        figures.image_format(output)  # (a wrong suffix or a missing matplotlib: before any work)
        if not figures.matplotlib_available():
            raise UsageError(f"--output {output}: images need matplotlib, which is not installed: "
                             f"{figures.INSTALL} (without --output, dlrun plot draws the curves in the terminal)")
    pixels = _size(size)
    if kind is not Kind.curves and metric:
        raise UsageError(f"--metric picks learning curves; --kind {kind.value} takes none")
    if kind is Kind.curves:
        if data is not None:
            raise UsageError("--data is for --kind boundary and confusion; learning curves come from metrics.csv")
        curves = [plots.read_curves(r) for r in runs]
        panels = plots.panels(curves, metric)
        if output is None:
            _terminal_curves(curves, panels)
            return
        fig = figures.curves_figure(curves, panels, pixels or figures.default_size("curves", len(panels)))
    elif kind is Kind.boundary:
        restored = [(open_trained(r, device, plugin), r.name or str(r)) for r in runs]
        if output is None:
            width = fits(out.width)[0]
            grid = (width, max(10, min(32, width * 2 // 5)))  # (a character is about twice as tall as wide)
            for model, name in restored:
                _terminal_boundary(model, plots.boundary(model, name, data, grid, batch_size))
            _note()
            return
        found = [plots.boundary(model, name, data, batch_size=batch_size) for model, name in restored]
        fig = figures.boundary_figure(found, pixels or figures.default_size("boundary", len(found)))
    else:
        found = [plots.confusion(open_trained(r, device, plugin), r.name or str(r), data, batch_size)
                 for r in runs]
        if output is None:
            for m in found:
                out.print(f"{m.run}: {m.data}, {m.samples} samples, accuracy {m.accuracy:.4f}", highlight=False,
                          markup=False)
                out.print(confusion_table(m.matrix.tolist(), m.names))
            return
        fig = figures.confusion_figure(found, pixels or figures.default_size("confusion", len(found)))
    try:
        figures.save(fig, output)
    except OSError as e:  # a full disk fails the command (1), as in train; a path that cannot be written is usage (2)
        kind_of = TrainingError if e.errno in FAULTS else UsageError
        raise kind_of(f"--output {output}: cannot write the file ({e.strerror or e}); nothing was written") from None
    err.print(f"{kind.value} of {len(runs)} run{'s' if len(runs) > 1 else ''} written to {output}", highlight=False,
              markup=False)


def _terminal_curves(curves: list[plots.Curves], panels: list[plots.Panel]) -> None:
    width, height = fits(out.width)
    for panel in panels:
        series = []
        for i, c in enumerate(curves):  # one colour a run (training and validation apart: one run); validation dashed
            for col in panel.columns:
                if c.has(col):
                    val = col.startswith("val_")
                    colour = COLOURS[i % len(COLOURS)] if len(curves) > 1 else COLOURS[int(val)]
                    series.append((col if len(curves) == 1 else f"{c.run} {col}", c.epochs, c.columns[col], colour,
                                   val))
        out.print(line_chart(series, width, height, panel.ylabel))
    _note()


def _terminal_boundary(model, b: plots.Boundary) -> None:
    predicted = inference.predictions(model, b.x).values[:, 0].astype(np.int64)
    names = [b.name(k) for k in range(b.classes)]
    out.print(region_map(b.regions, b.x, b.y, predicted, b.gx, b.gy,
                         f"{b.run}: accuracy {b.accuracy:.4f} on {len(b.y)} samples", names))


def _note() -> None:
    if not figures.matplotlib_available():
        err.print(f"note: for PNG or SVG images, install matplotlib ({figures.INSTALL}) and add --output FILE.png",
                  highlight=False, markup=False)
