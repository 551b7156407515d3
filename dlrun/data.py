"""Data generators and loaders, registered under ``data:`` in a config.

Each returns a :class:`Dataset` of host numpy arrays: features ``x`` (N, ...) and targets ``y``
(integer labels for classification, floats for regression). A generator may also provide its
own validation part; otherwise the trainer splits off ``train.validation_split`` with the run seed.
"""
from __future__ import annotations

import csv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .options import FilePath, NonNegativeFloat, NonNegativeInt, PositiveInt, did_you_mean
from .registry import data


@dataclass
class Dataset:
    """Host arrays for training (and optionally validation)."""

    x: np.ndarray
    y: np.ndarray
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    name: str = "data"
    rows: np.ndarray | None = None  # for a CSV file: the file line of each sample in x
    rows_val: np.ndarray | None = None  # ... and of each sample in x_val

    def __post_init__(self):  # a (plugin's) data generator that pairs samples and labels wrongly
        for x, y, part in ((self.x, self.y, ""), (self.x_val, self.y_val, "validation ")):
            if (x is None) != (y is None) or (x is not None and len(x) != len(y)):
                raise DataError(f"data {self.name!r}: {0 if x is None else len(x)} {part}samples but "
                                f"{0 if y is None else len(y)} labels; each sample needs one label (or target row)")

    def where(self, i: int, val: bool = False) -> str:
        """'file:line' for a CSV, else 'NAME: sample i' (1-based) for sample ``i`` of x (or x_val)."""
        rows = self.rows_val if val else self.rows
        if rows is not None:
            return f"{self.name}:{int(rows[i])}"
        return f"{self.name}: {'validation ' if val else ''}sample {i + 1}"

    def check_input_shape(self, expected: tuple[int, ...], model: str = "the model") -> None:
        """Raise DataError when samples do not have the per-sample shape a model takes."""
        for part, val in ((self.x, False), (self.x_val, True)):
            if part is not None and tuple(part.shape[1:]) != tuple(expected):
                got = part.shape[1:]
                what = f"{got[0]} features" if len(got) == 1 else f"shape {tuple(got)}"
                want = f"{expected[0]} features" if len(expected) == 1 else f"shape {tuple(expected)}"
                raise DataError(f"{self.where(0, val)}: each sample has {what}, but {model} takes {want}")

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
            f"validation_split={fraction} of {n} samples leaves no {part} data"
            + (f" (the split is stratified: each class holds out round(count x {fraction}) samples; the smallest "
               f"class has {int(np.unique(y, return_counts=True)[1].min())})" if stratify and y.dtype.kind in "iu"
               and y.ndim == 1 else f"; choose a fraction between {1 / n:.3g} and {1 - 1 / n:.3g}")
        )
    return x[~mask], y[~mask], x[mask], y[mask]


@data.register("spiral")
def spiral(classes: PositiveInt = 3, points_per_class: PositiveInt = 100,
           noise: NonNegativeFloat = 0.2, seed: NonNegativeInt = 0) -> Dataset:
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


def read_csv(path: Path, label_column: int | None, header: bool | None):
    """(features, labels or None, file line of each row); errors name the file and line."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        rows, lines = [], []
        for r in reader:
            if r and any(c.strip() for c in r):
                rows.append(r)
                lines.append(reader.line_num)
    if not rows:
        raise DataError(f"{path}: the file has no rows")
    if header is None:  # sniff: a first row that is not all numbers is a header
        header = not all(_is_number(c) for c in rows[0])
    start = 1 if header else 0
    if len(rows) <= start:
        raise DataError(f"{path}: the file has a header row but no data rows")
    width = len(rows[start])
    if label_column is not None and width < 2:
        raise DataError(f"{path}:{lines[start]}: expected at least 2 columns (features and a label), got {width}")
    if label_column is not None and not -width <= label_column < width:
        raise DataError(f"{path}: label_column {label_column} is out of range for {width} columns")
    values = np.empty((len(rows) - start, width))
    for k, (row, line) in enumerate(zip(rows[start:], lines[start:])):
        if len(row) != width:
            raise DataError(f"{path}:{line}: expected {width} columns (as in line {lines[start]}), got {len(row)}")
        for j, cell in enumerate(row):
            try:
                values[k, j] = float(cell)
            except ValueError:
                raise DataError(f"{path}:{line}: column {j + 1}: expected a number, got {cell.strip()!r}") from None
    line_of = np.asarray(lines[start:], dtype=np.int64)
    if label_column is None:
        return values, None, line_of
    lc = label_column % width
    return np.delete(values, lc, axis=1), values[:, lc], line_of


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def check_range(ds: Dataset, dtype) -> None:
    """Features finite in float64 but beyond ``dtype``'s range would become inf in the first batch."""
    limit = float(np.finfo(dtype).max)
    for x, val in ((ds.x, False), (ds.x_val, True)):
        if x is None or not len(x) or x.dtype.kind != "f":
            continue
        big = (np.abs(x) > limit).reshape(len(x), -1).any(axis=1)
        if big.any():
            i = int(np.flatnonzero(big)[0])
            row = np.asarray(x[i]).ravel()
            v = float(row[np.argmax(np.abs(row))])
            raise DataError(f"{ds.where(i, val)}: feature value {v:g} is beyond the range of {np.dtype(dtype)} "
                            f"(±{limit:.4g}), where it would become inf; scale the data, or set dtype: float64")


def check_indices(ds: Dataset, layer: str) -> None:
    """A model that starts with an index-taking layer (Embedding) needs whole-number features:
    casting 0.37 to an index would silently read row 0."""
    for x, val in ((ds.x, False), (ds.x_val, True)):
        if x is None or not len(x) or x.dtype.kind != "f":
            continue
        bad = (x != np.round(x)).reshape(len(x), -1).any(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            v = np.asarray(x[i]).ravel()
            raise DataError(f"{ds.where(i, val)}: {layer} takes integer indices, got {v[v != np.round(v)][0]:g}")


MAX_LABEL = 2 ** 31 - 1  # class indices beyond int32 are not classes anyone has outputs for


def _labels(y: np.ndarray, task: str, where) -> np.ndarray:
    if task == "regression":
        bad = ~np.isfinite(y)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{where(i)}: the target is {y[i]}, expected a finite number")
        return y.astype(np.float64)
    bad = ~np.isfinite(y) | (y != np.round(y)) | (y < 0) | (y > MAX_LABEL)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{where(i)}: class labels must be integers from 0 to {MAX_LABEL}, got {y[i]:g}")
    return y.astype(np.int64)


def expect_npy(p: Path) -> None:
    """An .npy file starts with the magic b'\\x93NUMPY' (an .npz is a zip); anything else would
    reach numpy's pickle fallback and be misreported as pickled objects."""
    with open(p, "rb") as f:
        head = f.read(6)
    if head != b"\x93NUMPY" and not head.startswith(b"PK"):
        raise DataError(f"{p}: not an .npy file (no NumPy header); save arrays with numpy.save, or use a CSV")


def _real(a: np.ndarray, p: Path, what: str) -> np.ndarray:
    if np.iscomplexobj(a):
        raise DataError(f"{p}: {what} holds complex numbers; expected real numbers")
    return np.asarray(a)


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
        raise DataError(f"data file not found: {p}" + (" (it is a folder)" if p.is_dir() else " (not a regular file)" if p.exists() else ""))
    suffix = p.suffix.lower()
    lines = None
    try:
        if suffix == ".npz":
            if not zipfile.is_zipfile(p):
                raise DataError(f"{p}: not an .npz archive (not a zip file); expected arrays saved with numpy.savez")
            with np.load(p, allow_pickle=False) as z:
                missing = [k for k in (features_key, labels_key) if k not in z.files]
                if missing:
                    raise DataError(f"{p}: no array {missing[0]!r} in the file{did_you_mean(missing[0], z.files)}; "
                                    f"it holds {', '.join(z.files) or 'nothing'}")
                x, y = _real(z[features_key], p, features_key), _real(z[labels_key], p, labels_key)
                if x.ndim == 0:
                    raise DataError(f"{p}: array {features_key!r} is a single number; expected one sample per row")
                x = (x[:, None] if x.ndim == 1 else x).astype(np.float64)  # 1-D: one feature per sample
        elif suffix == ".npy":
            expect_npy(p)
            arr = np.load(p, allow_pickle=False)
            if not isinstance(arr, np.ndarray):  # an .npz archive under an .npy name
                raise DataError(f"{p}: holds an .npz archive, not one array; rename it to .npz and name its "
                                f"arrays with features_key and labels_key")
            arr = _real(arr, p, "the array")
            if arr.ndim != 2 or arr.shape[1] < 2:
                raise DataError(f"{p}: expected a 2-D array (samples x columns, at least 2), got shape {arr.shape}")
            lc = label_column % arr.shape[1]
            x, y = np.delete(arr, lc, axis=1).astype(np.float64), arr[:, lc]
        else:
            x, y, lines = read_csv(p, label_column, header)
    except DataError:
        raise
    except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
        hint = " (it holds pickled objects, which dlrun never loads)" if "pickle" in str(e) else ""
        raise DataError(f"{p}: cannot read the file{hint}: {e}") from None
    if y.ndim != 1 or len(x) != len(y):
        raise DataError(f"{p}: {len(x)} feature rows but labels of shape {y.shape}; expected ({len(x)},)")
    if len(x) == 0:
        raise DataError(f"{p}: the file holds no samples")
    ds = Dataset(x, np.zeros(len(x), dtype=np.int64), name=str(p), rows=lines)
    bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        kind = "NaN" if np.isnan(x[i]).any() else "inf"
        raise DataError(f"{ds.where(i)}: features contain {kind} ({int(bad.sum())} sample"
                        f"{'s' if bad.sum() > 1 else ''} in all)")
    try:
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{p}: labels of dtype {y.dtype} are not numbers") from None
    ds.y = _labels(y, task, ds.where)
    return ds
