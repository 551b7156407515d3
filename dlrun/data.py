"""Data generators and loaders, registered under ``data:`` in a config.

Each returns a :class:`Dataset` of host numpy arrays: features ``x`` (N, ...) and targets ``y``
(integer labels for classification, floats for regression). A generator may also provide its
own validation part; otherwise the trainer splits off ``train.validation_split`` with the run seed.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .options import FilePath, NonNegativeFloat, PositiveInt
from .registry import data


@dataclass
class Dataset:
    """Host arrays for training (and optionally validation)."""

    x: np.ndarray
    y: np.ndarray
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    name: str = "data"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def num_classes(self) -> int | None:
        if self.y.dtype.kind not in "iu":
            return None
        ys = [self.y] + ([self.y_val] if self.y_val is not None else [])
        return int(max(int(a.max()) for a in ys if a.size)) + 1


def split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int, stratify: bool = True):
    """Seeded train/validation split; stratified by class for integer labels.

    Returns ``(x_train, y_train, x_val, y_val)``; raises DataError when either part is empty.
    """
    n = len(x)
    if fraction <= 0:
        return x, y, None, None
    rng = np.random.default_rng(seed)
    if stratify and y.dtype.kind in "iu" and y.ndim == 1:
        val_idx = []
        for c in np.unique(y):
            idx = np.flatnonzero(y == c)
            rng.shuffle(idx)
            val_idx.append(idx[: int(round(len(idx) * fraction))])
        val = np.sort(np.concatenate(val_idx))
    else:
        perm = rng.permutation(n)
        val = np.sort(perm[: int(round(n * fraction))])
    mask = np.zeros(n, dtype=bool)
    mask[val] = True
    if mask.all() or not mask.any():
        part = "training" if mask.all() else "validation"
        raise DataError(
            f"validation_split={fraction} of {n} samples leaves no {part} data; "
            f"choose a fraction between {1 / n:.3g} and {1 - 1 / n:.3g}"
        )
    return x[~mask], y[~mask], x[mask], y[mask]


@data.register("spiral")
def spiral(classes: PositiveInt = 3, points_per_class: PositiveInt = 100,
           noise: NonNegativeFloat = 0.2, seed: int = 0) -> Dataset:
    """Interleaved 2-D spirals (the cs231n case study), one arm per class.

    For class j: r = linspace(0, 1, n), t = linspace(4j, 4(j+1), n) + noise·N(0, 1),
    point = (r·sin t, r·cos t).

    Args:
        classes: number of classes (spiral arms).
        points_per_class: points in each arm.
        noise: standard deviation of the angle noise.
        seed: seed of the noise.
    """
    rng = np.random.default_rng(seed)
    n = points_per_class
    r = np.tile(np.linspace(0.0, 1.0, n), classes)
    base = np.linspace(0.0, 4.0, n)
    t = (base[None, :] + 4.0 * np.arange(classes)[:, None]).ravel() + noise * rng.standard_normal(n * classes)
    x = np.stack([r * np.sin(t), r * np.cos(t)], axis=1)
    y = np.repeat(np.arange(classes, dtype=np.int64), n)
    return Dataset(x, y, name="spiral")


def _read_csv(path: Path, label_column: int | None, header: bool | None):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    rows = [r for r in rows if r and any(c.strip() for c in r)]
    if not rows:
        raise DataError(f"{path}: the file has no rows")
    if header is None:  # sniff: a first row that is not all numbers is a header
        header = not all(_is_number(c) for c in rows[0])
    start = 1 if header else 0
    width = len(rows[start]) if len(rows) > start else 0
    values = np.empty((len(rows) - start, width))
    for i, row in enumerate(rows[start:], start=start + 1):
        if len(row) != width:
            raise DataError(f"{path}:{i}: expected {width} columns (as in row {start + 1}), got {len(row)}")
        for j, cell in enumerate(row):
            try:
                values[i - start - 1, j] = float(cell)
            except ValueError:
                raise DataError(f"{path}:{i}: column {j + 1}: expected a number, got {cell.strip()!r}") from None
    if label_column is None:
        return values, None
    lc = label_column % width
    return np.delete(values, lc, axis=1), values[:, lc]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _labels(y: np.ndarray, path: Path, task: str) -> np.ndarray:
    if task == "regression":
        return y.astype(np.float64)
    if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)) or (y < 0).any():
        bad = int(np.flatnonzero(~np.isfinite(y) | (y != np.round(y)) | (y < 0))[0])
        raise DataError(f"{path}: sample {bad + 1}: class labels must be integers >= 0, got {float(y[bad]):g}")
    return y.astype(np.int64)


@data.register("file")
def load_file(path: FilePath, label_column: int = -1, header: bool | None = None,
              task: str = "classification", features_key: str = "x", labels_key: str = "y") -> Dataset:
    """Features and labels from a CSV, .npy or .npz file.

    CSV: one sample per row; the label is column ``label_column`` (default the last); a header
    row is detected automatically unless ``header`` is given. ``.npz``: arrays ``features_key``
    and ``labels_key``. ``.npy``: a 2-D array whose ``label_column`` holds the labels.

    Args:
        path: the file, relative to the config file.
        label_column: index of the label column in CSV/.npy (negative counts from the end).
        header: whether the CSV's first row is a header (default: detect).
        task: "classification" (integer labels) or "regression" (float targets).
        features_key: name of the feature array in an .npz file.
        labels_key: name of the label array in an .npz file.
    """
    p = Path(path)
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                missing = [k for k in (features_key, labels_key) if k not in z.files]
                if missing:
                    raise DataError(f"{p}: no array {missing[0]!r} in the file; it holds {', '.join(z.files)}")
                x, y = np.asarray(z[features_key], dtype=np.float64), np.asarray(z[labels_key])
        elif suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
            if arr.ndim != 2:
                raise DataError(f"{p}: expected a 2-D array (samples x columns), got shape {arr.shape}")
            lc = label_column % arr.shape[1]
            x, y = np.delete(arr, lc, axis=1).astype(np.float64), arr[:, lc]
        else:
            x, y = _read_csv(p, label_column, header)
    except (ValueError, OSError) as e:
        raise DataError(f"{p}: cannot read the file ({e})") from None
    if len(x) != len(y):
        raise DataError(f"{p}: {len(x)} feature rows but {len(y)} labels")
    bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if bad.any():
        raise DataError(f"{p}: sample {int(np.flatnonzero(bad)[0]) + 1}: features contain NaN or inf")
    return Dataset(x, _labels(np.asarray(y, dtype=np.float64), p, task), name=p.stem)
