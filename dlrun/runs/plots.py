"""What ``dlrun plot`` draws, as data: learning curves from metrics.csv, the decision regions of a
classifier of two features over its data, and the confusion matrix ``dlrun evaluate`` computes.

The pictures themselves are drawn by :mod:`dlrun.runs.figures` (images, with matplotlib) and by
the command line (curves in the terminal).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import inference
from ..errors import DataError, UsageError
from ..registry.options import did_you_mean

LEARNING_RATE = "learning_rate"


@dataclass
class Curves:
    """One run's metrics.csv: ``epochs`` and each recorded column's values by epoch (NaN where a
    cell is empty: a metric added on resume, no validation data)."""

    run: str
    epochs: np.ndarray
    columns: dict[str, np.ndarray]

    def has(self, column: str) -> bool:
        return column in self.columns and not np.isnan(self.columns[column]).all()


@dataclass
class Panel:
    """One chart of the learning curves: ``metric`` (loss, accuracy, f1, learning_rate) and the
    metrics.csv columns drawn on it (train_loss and val_loss, say)."""

    metric: str
    columns: list[str]

    @property
    def ylabel(self) -> str:
        return self.metric.replace("_", " ")


def read_curves(run_dir: str | Path) -> Curves:
    """The learning curves of a run directory (its metrics.csv)."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.csv"
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a run directory (expected a folder written by dlrun train)")
    if not path.is_file():
        raise UsageError(f"{run_dir}: no metrics.csv (expected a run directory written by dlrun train)")
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: cannot read the file ({getattr(e, 'strerror', None) or e})") from None
    if not rows or "epoch" not in rows[0]:
        raise DataError(f"{path}: expected a header row starting with epoch, got {rows[0] if rows else 'an empty file'}")
    header = rows[0]
    body = [r for r in rows[1:] if r and len(r) == len(header) and r[0].isdigit()]
    if not body:
        raise UsageError(f"{path}: no epoch recorded yet (nothing to plot)")
    values = np.full((len(body), len(header)), np.nan)
    for i, r in enumerate(body):
        for j, cell in enumerate(r):
            try:
                values[i, j] = float(cell) if cell != "" else np.nan
            except ValueError:
                raise DataError(f"{path}:{rows.index(r) + 1}: {header[j]}: expected a number, got {cell!r}") from None
    cols = {c: values[:, j] for j, c in enumerate(header) if c not in ("epoch", "seconds")}
    return Curves(run_dir.name or str(run_dir), values[:, header.index("epoch")], cols)


def _metrics(curves: list[Curves]) -> list[str]:
    """The metrics the runs recorded, in metrics.csv's order: loss, accuracy, train.metrics."""
    names: list[str] = []
    for c in curves:
        for col in c.columns:
            base = col.split("_", 1)[1] if col.startswith(("train_", "val_")) else None
            if base is not None and base not in names and (c.has(f"train_{base}") or c.has(f"val_{base}")):
                names.append(base)
    return names


def panels(curves: list[Curves], wanted: list[str] = ()) -> list[Panel]:
    """The charts to draw: each ``wanted`` metric (``loss``: train_loss and val_loss; a column
    such as ``val_loss`` alone; ``learning_rate``), or every recorded metric and the learning
    rate. A name no run recorded is an error with the names there are."""
    names = _metrics(curves)
    columns = [col for c in curves for col in c.columns if c.has(col)]
    if not wanted:
        out = [Panel(m, [f"train_{m}", f"val_{m}"]) for m in names]
        return out + ([Panel(LEARNING_RATE, [LEARNING_RATE])] if LEARNING_RATE in columns else [])
    out = []
    for w in wanted:
        if w in names:
            out.append(Panel(w, [f"train_{w}", f"val_{w}"]))
        elif w in columns:
            out.append(Panel(w, [w]))
        else:
            metrics = names + ([LEARNING_RATE] if LEARNING_RATE in columns else [])
            raise UsageError(f"--metric {w}: not recorded by {'this run' if len(curves) == 1 else 'these runs'}"
                             f"{did_you_mean(w, list(dict.fromkeys(metrics + columns)))}; recorded: "
                             f"{', '.join(metrics)} (or one column of metrics.csv, such as {columns[0]})")
    return out


@dataclass
class Boundary:
    """The classes a 2-feature classifier predicts over a grid, with the data it was trained on.

    ``gx``, ``gy``: the grid's coordinates; ``regions[i, j]``: the class predicted at
    (gx[j], gy[i]); ``x``, ``y``: the samples and their labels; ``validation``: whether each
    sample is a validation one."""

    run: str
    gx: np.ndarray
    gy: np.ndarray
    regions: np.ndarray
    x: np.ndarray
    y: np.ndarray
    validation: np.ndarray
    classes: int
    data: str
    accuracy: float = field(default=float("nan"))
    names: list[str] | None = None  # the class names the run learned, if any

    def name(self, k: int) -> str:
        return self.names[k] if self.names is not None and k < len(self.names) else f"class {k}"


def boundary(restored: inference.Restored, run: str, spec: str | None = None, resolution: int | tuple = 300,
             batch_size: int | None = None) -> Boundary:
    """The decision regions of ``restored`` over its run's data (training and validation), or over
    ``spec`` (a data file or generator, as ``dlrun evaluate --data``), on a ``resolution`` ×
    ``resolution`` grid (or ``(columns, rows)``) spanning the samples with a margin."""
    if not restored.classification:
        raise UsageError(f"{run}: a decision boundary needs a classification model; this one is trained with "
                         f"{type(restored.loss).__name__}, a {restored.loss.task} loss (plot its curves instead)")
    shape = tuple(restored.model.input_shape)
    if shape != (2,):
        raise UsageError(f"{run}: a decision boundary is drawn for a model of 2 input features; this one takes "
                         f"samples of shape {shape} (plot its curves or its confusion matrix instead)")
    if spec is None:
        ds = inference.run_data(restored)
        parts = [(ds.x, ds.y, False)] + ([(ds.x_val, ds.y_val, True)] if ds.x_val is not None and len(ds.x_val) else [])
        x = np.concatenate([p[0] for p in parts]).reshape(-1, 2)
        y = np.concatenate([p[1] for p in parts])
        validation = np.concatenate([np.full(len(p[0]), p[2]) for p in parts])
        data = ds.name + (" (training and validation samples)" if len(parts) > 1 else "")
    else:
        x, y, data = inference.evaluation_data(restored, spec)
        x = x.reshape(-1, 2)
        validation = np.zeros(len(x), bool)
    lo, hi = x.min(axis=0), x.max(axis=0)
    pad = np.maximum((hi - lo) * 0.08, 1e-3)
    nx, ny = resolution if isinstance(resolution, tuple) else (resolution, resolution)
    gx = np.linspace(lo[0] - pad[0], hi[0] + pad[0], nx)
    gy = np.linspace(lo[1] - pad[1], hi[1] + pad[1], ny)
    grid = np.stack(np.meshgrid(gx, gy), axis=-1).reshape(-1, 2)
    table = inference.predictions(restored, grid, batch_size=batch_size or 4096)
    regions = table.values[:, 0].astype(np.int64).reshape(ny, nx)
    predicted = inference.predictions(restored, x, batch_size=batch_size or 4096).values[:, 0].astype(np.int64)
    outputs = restored.model.output_shape[-1] if restored.model.output_shape else 1
    loss = restored.loss
    classes = int(loss.classes(outputs) if hasattr(loss, "classes") else outputs)
    classes = max(classes, int(y.max()) + 1 if len(y) else 1, int(regions.max()) + 1)
    return Boundary(run, gx, gy, regions, x, np.asarray(y, np.int64), validation, classes, data,
                    float((predicted == y).mean()) if len(y) else math.nan, restored.classes)


@dataclass
class Confusion:
    """The confusion matrix of a run's model (rows: true class, columns: predicted), as
    ``dlrun evaluate`` reports it on the same data."""

    run: str
    matrix: np.ndarray
    accuracy: float
    data: str
    samples: int
    names: list[str] | None = None  # the class names the run learned, if any


def confusion(restored: inference.Restored, run: str, spec: str | None = None,
              batch_size: int | None = None) -> Confusion:
    """``dlrun evaluate``'s confusion matrix: on the run's validation data, or on ``spec``."""
    if not restored.classification:
        raise UsageError(f"{run}: a confusion matrix needs a classification model; this one is trained with "
                         f"{type(restored.loss).__name__}, a {restored.loss.task} loss (dlrun evaluate reports its "
                         f"errors)")
    x, y, data = inference.evaluation_data(restored, spec)
    result = restored.evaluate(x, y, batch_size)
    return Confusion(run, np.asarray(result.confusion, np.int64), result.accuracy, data, result.samples,
                     result.classes)
