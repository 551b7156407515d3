"""The images of ``dlrun plot``, drawn with matplotlib (the ``plot`` extra) without a display:
learning curves, decision boundaries and confusion matrices (their data: :mod:`dlrun.runs.plots`).

Each function returns a :class:`matplotlib.figure.Figure` of the size asked for, in pixels (100
per inch); :func:`save` writes it as PNG or SVG by the file's suffix. No pyplot: no global state,
no window, whatever ``MPLBACKEND`` says.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..errors import UsageError
from .plots import Boundary, Confusion, Curves, Panel

DPI = 100
FORMATS = {".png": "png", ".svg": "svg"}
INSTALL = "pip install 'dlrun[plot]'"


def matplotlib_available() -> bool:
    """Whether images can be drawn (matplotlib imports)."""
    try:
        _figure_class()
    except UsageError:
        return False
    return True


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(f"images need matplotlib, which is not installed: {INSTALL}") from None
    return Figure


def _figure(width: int, height: int):
    return _figure_class()(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")


def _grid(n: int, most: int) -> tuple[int, int]:
    cols = min(n, most)
    return math.ceil(n / cols), cols


def default_size(kind: str, count: int) -> tuple[int, int]:
    """A figure size in pixels for ``count`` panels of ``kind`` (curves, boundary, confusion)."""
    rows, cols = _grid(count, 2 if kind == "curves" else 3)
    each = {"curves": (560, 340), "boundary": (520, 500), "confusion": (500, 440)}[kind]
    return each[0] * cols, each[1] * rows


def curves_figure(curves: list[Curves], panels: list[Panel], size: tuple[int, int]):
    """One chart per panel, epochs across: each run in its own colour (named in the legend),
    training solid and validation dashed; the learning rate on a chart of its own."""
    fig = _figure(*size)
    rows, cols = _grid(len(panels), 2)
    axes = fig.subplots(rows, cols, squeeze=False)
    colours = [f"C{i % 10}" for i in range(len(curves))]  # one colour a run (one run: training and validation apart)
    for k, panel in enumerate(panels):
        ax = axes.flat[k]
        for c, colour in zip(curves, colours):
            for col in panel.columns:
                if not c.has(col):
                    continue
                part = "validation" if col.startswith("val_") else "training" if col.startswith("train_") else None
                label = c.run if len(curves) > 1 else col
                if len(curves) > 1 and len(panel.columns) > 1 and part:
                    label = f"{c.run} ({part})"
                ax.plot(c.epochs, c.columns[col], color=colour if len(curves) > 1 else f"C{int(part == 'validation')}",
                        linestyle="--" if part == "validation" else "-",
                        linewidth=1.5, label=label, marker="o" if len(c.epochs) == 1 else None)
        ax.set_xlabel("epoch")
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.metric.replace("_", " "))
        values = np.concatenate([c.columns[col] for c in curves for col in panel.columns if c.has(col)])
        values = values[np.isfinite(values)]
        if panel.metric == "learning_rate" and len(values) and values.min() > 0 and values.max() / values.min() > 50:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    return fig


def boundary_figure(boundaries: list[Boundary], size: tuple[int, int]):
    """For each run, the class it predicts over the plane (pale regions) and the samples, in their
    true class's colour (validation samples as triangles): the cs231n spiral picture."""
    from matplotlib.colors import ListedColormap, to_rgb  # (the Figure above imported matplotlib)
    fig = _figure(*size)
    rows, cols = _grid(len(boundaries), 3)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, b in zip(axes.flat, boundaries):
        base = [np.array(to_rgb(f"C{k % 10}")) for k in range(b.classes)]
        pale = ListedColormap([0.35 * c + 0.65 for c in base])
        ax.pcolormesh(b.gx, b.gy, b.regions, cmap=pale, vmin=-0.5, vmax=b.classes - 0.5, shading="auto",
                      rasterized=True)
        for k in range(b.classes):
            for val, marker in ((False, "o"), (True, "^")):
                pick = (b.y == k) & (b.validation == val)
                if pick.any():
                    ax.scatter(b.x[pick, 0], b.x[pick, 1], s=18, color=base[k], edgecolors="black", linewidths=0.4,
                               marker=marker, label=b.name(k) + (" (validation)" if val else ""))
        ax.set_xlim(b.gx[0], b.gx[-1])
        ax.set_ylim(b.gy[0], b.gy[-1])
        ax.set_xlabel("feature 0")
        ax.set_ylabel("feature 1")
        ax.set_title(f"{b.run}\naccuracy {b.accuracy:.4f} on {len(b.y)} samples", fontsize="medium")
        ax.legend(fontsize="x-small", loc="best")
    for ax in list(axes.flat)[len(boundaries):]:
        ax.set_visible(False)
    return fig


def confusion_figure(matrices: list[Confusion], size: tuple[int, int]):
    """For each run, ``dlrun evaluate``'s confusion matrix: counts in the cells, rows the true
    class, columns the predicted one (scikit-learn's and Keras' layout)."""
    fig = _figure(*size)
    rows, cols = _grid(len(matrices), 3)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, m in zip(axes.flat, matrices):
        cm = m.matrix
        ax.imshow(cm, cmap="Blues", vmin=0, vmax=max(int(cm.max()), 1))
        n = len(cm)
        if n <= 30:  # counts written in the cells while they fit
            for i in range(n):
                for j in range(n):
                    ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize="small" if n <= 12 else 5,
                            color="white" if cm[i, j] > cm.max() / 2 else "black")
        ticks = np.arange(n) if n <= 30 else np.arange(0, n, max(1, n // 10))
        names = m.names if m.names is not None and len(m.names) == n else None
        ax.set_xticks(ticks, [names[t] for t in ticks] if names else None)
        ax.set_yticks(ticks, [names[t] for t in ticks] if names else None)
        ax.set_xlabel("predicted class")
        ax.set_ylabel("true class")
        ax.set_title(f"{m.run}\naccuracy {m.accuracy:.4f} on {m.samples} samples", fontsize="medium")
    for ax in list(axes.flat)[len(matrices):]:
        ax.set_visible(False)
    return fig


def image_format(path: str | Path) -> str:
    """'png' or 'svg' by the output file's suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"--output {path}: expected a file name ending in .png or .svg, got "
                         f"{suffix or 'no suffix'!r}")
    return FORMATS[suffix]


def save(fig, path: str | Path) -> None:
    """Write ``fig`` to ``path`` (PNG or SVG by its suffix) at its size in pixels, whole or not at
    all: through a temporary file beside it, so a failure leaves no partial image and a file
    already there intact. A path that is not a regular file (``/dev/null``) is written directly."""
    from matplotlib import rc_context
    path = Path(path)
    fmt = image_format(path)
    # SVG text stays text (searchable, selectable, smaller), and no date: the same runs give the same file
    options = {"format": fmt, "dpi": DPI, "metadata": {"Date": None} if fmt == "svg" else {}}
    with rc_context({"svg.fonttype": "none"}):
        if path.exists() and not path.is_file():
            fig.savefig(str(path), **options)
            return
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            fig.savefig(str(tmp), **options)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
