"""Charts in the terminal for ``dlrun plot`` where no image is asked for or matplotlib is missing:
line charts drawn with braille characters (2 × 4 dots a character), and maps of decision regions."""
from __future__ import annotations

import math

import numpy as np
from rich.text import Text

# the dot bit of each (column, row) of a braille character's 2 × 4 cell (Unicode U+2800 block)
_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
COLOURS = ("blue", "red", "green", "magenta", "cyan", "yellow", "bright_blue", "bright_red")


def _ticks(v: float) -> str:
    return f"{v:.4g}" if v == 0 or 1e-3 <= abs(v) < 1e5 else f"{v:.2e}"


def line_chart(series: list[tuple[str, np.ndarray, np.ndarray, str, bool]], width: int, height: int,
               title: str) -> Text:
    """A chart ``width`` × ``height`` characters (plus its axis labels and legend) of ``series``:
    (label, x, y, colour, dashed) each; NaN values are gaps. Dashed series draw every other dot,
    so training (solid) and validation (dashed) stay apart without colour too."""
    finite = [(x[np.isfinite(y)], y[np.isfinite(y)]) for _, x, y, _, _ in series]
    xs = np.concatenate([x for x, _ in finite] or [np.zeros(0)])
    ys = np.concatenate([y for _, y in finite] or [np.zeros(0)])
    out = Text(f"{title}\n", style="bold")
    if not len(ys):
        return out.append("  (no values)\n")
    x0, x1 = float(xs.min()), float(xs.max())
    y0, y1 = float(ys.min()), float(ys.max())
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.05, y1 + (abs(y1) or 1) * 0.05
    if x1 == x0:
        x1 = x0 + 1
    dots_w, dots_h = width * 2, height * 4
    cells = np.zeros((height, width), np.int64)  # braille bits
    owner = np.full((height, width), -1)  # the series whose dot came last, for its colour
    for k, (_, x, y, _, dashed) in enumerate(series):
        px = (x - x0) / (x1 - x0) * (dots_w - 1)
        py = (y1 - y) / (y1 - y0) * (dots_h - 1)
        ok = np.isfinite(py)
        parts = []
        for i in np.flatnonzero(ok):  # each point, and the segment to the next one dot by dot
            j = i + 1 if i + 1 < len(x) and ok[i + 1] else i
            t = np.linspace(0, 1, int(max(abs(px[j] - px[i]), abs(py[j] - py[i]))) + 2)
            parts.append((px[i] + (px[j] - px[i]) * t, py[i] + (py[j] - py[i]) * t))
        if not parts:
            continue
        dx = np.rint(np.concatenate([p[0] for p in parts])).astype(int)
        dy = np.rint(np.concatenate([p[1] for p in parts])).astype(int)
        if dashed:
            keep = (np.arange(len(dx)) // 3) % 2 == 0  # three dots on, three off, along the line
            dx, dy = dx[keep], dy[keep]
        for a, b in zip(dx, dy):
            cells[b // 4, a // 2] |= _BITS[a % 2][b % 4]
            owner[b // 4, a // 2] = k
    labels = [_ticks(y1), _ticks((y0 + y1) / 2), _ticks(y0)]
    pad = max(map(len, labels))
    marks = {0: labels[0], height // 2: labels[1], height - 1: labels[2]}
    for r in range(height):
        out.append(f"{marks.get(r, ''):>{pad}} ┤" if r in marks else f"{'':>{pad}} │")
        for c in range(width):
            ch = chr(0x2800 + int(cells[r, c])) if cells[r, c] else " "
            out.append(ch, style=series[owner[r, c]][3] if owner[r, c] >= 0 else None)
        out.append("\n")
    left, right = _ticks(x0), _ticks(x1)
    out.append(f"{'':>{pad}} └" + "─" * width + "\n")
    out.append(f"{'':>{pad}}  {left}{'epoch':^{max(width - len(left) - len(right), 5)}}{right}\n")
    for label, _, _, colour, dashed in series:
        out.append(f"{'':>{pad}}  ")
        out.append("⠒⠒⠒" if not dashed else "⠂⠐⠂", style=colour)
        out.append(f" {label}\n")
    return out


def fits(columns: int) -> tuple[int, int]:
    """A chart's width and height in characters for a terminal of ``columns``."""
    width = max(20, min(columns, 120) - 14)
    return width, max(8, min(16, math.ceil(width / 5)))


def region_map(regions: np.ndarray, x: np.ndarray, y: np.ndarray, predicted: np.ndarray, gx: np.ndarray,
               gy: np.ndarray, title: str, names: list[str]) -> Text:
    """The classes predicted over the plane, one character a grid point (``regions[i, j]`` at
    (gx[j], gy[i]), the top row the largest y): the class's digit, dim, in its colour; a cell
    holding samples shows ● in their true class's colour, or x where one is misclassified
    (``predicted``), so the map reads without colour too."""
    rows, cols = regions.shape
    cx = np.clip(np.rint((x[:, 0] - gx[0]) / (gx[-1] - gx[0]) * (cols - 1)).astype(int), 0, cols - 1)
    cy = np.clip(np.rint((x[:, 1] - gy[0]) / (gy[-1] - gy[0]) * (rows - 1)).astype(int), 0, rows - 1)
    cell_class = np.full(regions.shape, -1)
    wrong = np.zeros(regions.shape, bool)
    cell_class[cy, cx] = y
    np.logical_or.at(wrong, (cy, cx), predicted != y)
    out = Text(f"{title}\n", style="bold")
    labels = {0: _ticks(gy[-1]), rows - 1: _ticks(gy[0])}
    pad = max(map(len, labels.values()))
    for r in range(rows):
        i = rows - 1 - r  # (the top row is the largest y)
        out.append(f"{labels.get(r, ''):>{pad}} {'┤' if r in labels else '│'}")
        for j in range(cols):
            k = cell_class[i, j]
            if k >= 0:
                out.append("x" if wrong[i, j] else "●", style=f"bold {COLOURS[k % len(COLOURS)]}")
            else:
                c = int(regions[i, j])
                out.append(str(c % 10), style=f"dim {COLOURS[c % len(COLOURS)]}")
        out.append("\n")
    left, right = _ticks(gx[0]), _ticks(gx[-1])
    out.append(f"{'':>{pad}} └" + "─" * cols + "\n")
    out.append(f"{'':>{pad}}  {left}{'feature 0 →':^{max(cols - len(left) - len(right), 11)}}{right}\n")
    for k, name in enumerate(names):
        out.append(f"{'':>{pad}}  ")
        out.append(f"{k % 10} ●", style=COLOURS[k % len(COLOURS)])
        out.append(f" {name}\n")
    out.append(f"{'':>{pad}}  digits: the class predicted there; ●: samples; x: a sample predicted wrong "
               f"(feature 1 up)\n")
    return out
