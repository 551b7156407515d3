"""The ``file`` data loader: features and labels from a CSV, .npy or .npz file, with errors that
name the file and line (a row of a CSV, the array of an archive)."""
from __future__ import annotations

import csv
import zipfile
from pathlib import Path

import numpy as np

from . import Dataset, table
from ..errors import DataError
from ..registry.options import FilePath, OptionError, did_you_mean
from ..registry import data


MAX_LINE = 1 << 24  # characters in one line of a CSV file (16 Mi: a million features of 15 characters)
BINARY_PROBE = 1 << 16  # bytes read to tell a binary file from text before any parsing


def read_rows(path: Path, delimiter: str = ",") -> tuple[list[list[str]], list[int]]:
    """The non-blank rows of a CSV file as lists of cells, with the file line of each; errors
    name the file and line. A binary file is refused from its first block, and lines are read in
    bounded pieces, so a large file that is not CSV text costs neither time nor memory."""
    refuse_binary(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # (-sig: a spreadsheet's BOM)
            reader = csv.reader(_bounded_lines(f, path), delimiter=delimiter)
            rows, lines = [], []
            try:
                for r in reader:
                    if r and any(c.strip() for c in r):
                        rows.append(r)
                        lines.append(reader.line_num)
            except csv.Error as e:
                raise DataError(_csv_problem(path, reader.line_num, e)) from None
    except UnicodeDecodeError:
        raise DataError(_not_utf8(path)) from None
    return rows, lines


def read_table(path: Path, delimiter: str = ",", **options) -> table.Parsed:
    """A CSV's feature columns, labels and lines (:func:`dlrun.data.table.parse` takes the options)."""
    rows, lines = read_rows(path, delimiter)
    return table.parse(path, rows, lines, delimiter=delimiter, **options)


def read_csv(path: Path, label_column: int | None, header: bool | None, delimiter: str = ","):
    """(features, labels or None, file line of each row) of a CSV of numbers; errors name the
    file and line."""
    parsed = read_table(path, delimiter, header=header, label_column=label_column)
    return parsed.x, parsed.y, parsed.lines


def refuse_binary(path: Path) -> None:
    """DataError naming the file and line when its first block holds a NUL byte, which no CSV
    text has (a binary file, or an archive or array file with a .csv name)."""
    with open(path, "rb") as f:
        head = f.read(BINARY_PROBE)
    at = head.find(b"\0")
    if at >= 0:
        line = head.count(b"\n", 0, at) + 1
        raise DataError(f"{path}:{line}: a binary file, not CSV text (a NUL byte at byte {at + 1:,}); expected "
                        f"numbers separated by commas, one sample per line (or an .npy or .npz file under its own "
                        f"suffix)")


def _bounded_lines(f, path: Path):
    """The lines of text file ``f``, each read at most MAX_LINE characters at a time: a line
    longer than that (a file without line breaks) is refused, not read whole into memory."""
    n = 0
    while line := f.readline(MAX_LINE + 1):
        n += 1
        if len(line) > MAX_LINE:
            raise DataError(f"{path}:{n}: a line longer than {MAX_LINE:,} characters; expected one sample per line "
                            f"(is this a CSV file?)")
        yield line


def _csv_problem(path: Path, line: int, e: csv.Error) -> str:
    """'FILE:LINE: ...' for what Python's csv module refuses (a cell beyond its size limit)."""
    if "field larger than field limit" in str(e):
        return (f"{path}:{line}: a cell longer than {csv.field_size_limit():,} characters; expected numbers "
                f"separated by commas")
    return f"{path}:{line}: not readable as CSV ({e})"


def _not_utf8(path: Path) -> str:
    """'FILE:LINE: ...' for the first line of a CSV that is not UTF-8 text (read in bounded pieces)."""
    with open(path, "rb") as f:
        n, column, carry = 1, 0, b""
        while piece := f.readline(MAX_LINE):
            raw, carry = carry + piece, b""
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if e.reason == "unexpected end of data" and not raw.endswith(b"\n"):  # a character cut by the piece
                    raw, carry = raw[:e.start], raw[e.start:]
                else:
                    return (f"{path}:{n}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                            f"{column + e.start + 1}); save the file as UTF-8 (or plain ASCII)")
            if raw.endswith(b"\n"):
                n, column = n + 1, 0
            else:  # a piece of a long line
                column += len(raw)
    return f"{path}: not UTF-8 text; save the file as UTF-8"


MAX_LABEL = 2 ** 31 - 1  # class indices beyond int32 are not classes anyone has outputs for


def _labels(y: np.ndarray, task: str, where) -> np.ndarray:
    if task == "regression":  # (N,) or (N, K) targets
        bad = ~np.isfinite(y.reshape(len(y), -1)).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            got = y[i] if y.ndim == 1 else y[i][~np.isfinite(y[i])][0]
            raise DataError(f"{where(i)}: the target is {got}, expected a finite number")
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
              task: str = "classification", features_key: str = "x", labels_key: str = "y",
              validation_path: FilePath | None = None, target: str | None = None,
              features: list[str] | None = None, categorical: list[str] | None = None,
              delimiter: str = ",") -> Dataset:
    """Features and labels from a CSV, .npy or .npz file.

    CSV: one sample per row; the label is column ``label_column`` (default the last), or the
    column a header row names with ``target``; a header row is detected automatically unless
    ``header`` is given. Class labels may be numbers (0, 1, ...) or names (``yes``/``no``,
    mapped to indices in sorted order). ``.npz``: arrays ``features_key`` and ``labels_key``.
    ``.npy``: a 2-D array whose ``label_column`` holds the labels. ``validation_path`` names a
    second file, read the same way, that holds the validation samples (Keras'
    ``validation_data``); train.validation_split must then be 0.

    Args:
        path: the file, relative to the config file.
        label_column: index of the label column in CSV/.npy (negative counts from the end).
        header: whether the CSV's first row is a header (default: detect).
        task: "classification" (class labels) or "regression" (float targets).
        features_key: name of the feature array in an .npz file.
        labels_key: name of the label array in an .npz file.
        validation_path: a file of validation samples in the same format, relative to the config file.
        target: the label column by its header name (instead of label_column).
        features: the feature columns by header name, in this order (default: every other column).
        categorical: feature columns that hold categories (text such as north/south), encoded as
            data.preprocess.categorical says; every other feature column holds numbers.
        delimiter: the character between a CSV's columns (one character, e.g. ";" or "\\t").
    """
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    if len(delimiter) != 1 or delimiter in "\"\r\n":
        raise OptionError(f"expected one character that is not a quote or line break, such as ',' or ';', "
                          f"got {delimiter!r}", option="delimiter")
    columns = {"target": target, "features": features, "categorical": categorical, "delimiter": delimiter}
    ds = _read(Path(path), label_column, header, task, features_key, labels_key, columns)
    if validation_path is None:
        return ds
    try:
        val = _read(Path(validation_path), label_column, header, task, features_key, labels_key, columns)
        if val.x.shape[1:] != ds.x.shape[1:] or val.columns != ds.columns:
            names = val.x.shape[1:] == ds.x.shape[1:]  # (same count, other names)
            what = f"columns {', '.join(val.columns or ())}" if names else f"samples of shape {val.x.shape[1:]}"
            was = f"columns {', '.join(ds.columns or ())}" if names else f"samples of shape {ds.x.shape[1:]}"
            raise DataError(f"{val.name}: {what}, but the training file {ds.name} has {was}; both files need the "
                            f"same columns")
        if (val.y.dtype.kind == "U") != (ds.y.dtype.kind == "U"):
            raise DataError(f"{val.name}: labels are {'names' if val.y.dtype.kind == 'U' else 'numbers'}, but the "
                            f"training file {ds.name} has {'names' if ds.y.dtype.kind == 'U' else 'numbers'}")
    except DataError as e:
        e.option = "validation_path"  # the config key to point at (data.load_data)
        raise
    return Dataset(ds.x, ds.y, val.x, val.y, name=ds.name, rows=ds.rows, rows_val=val.rows, name_val=val.name,
                   columns=ds.columns, target=ds.target)


def _read(p: Path, label_column: int, header: bool | None, task: str, features_key: str, labels_key: str,
          columns: dict) -> Dataset:
    """One file's samples and labels as a Dataset named by the file."""
    if not p.is_file():
        raise DataError(f"data file not found: {p}" + (" (it is a folder)" if p.is_dir() else " (not a regular file)" if p.exists() else ""))
    suffix = p.suffix.lower()
    lines = names = target = None
    named = [k for k in ("target", "features", "categorical") if columns[k] is not None]
    if named and suffix in (".npz", ".npy"):
        raise DataError(f"{p}: data.{named[0]} names CSV columns, but this is an {suffix} file (its columns have "
                        f"no names); use label_column, or a CSV with a header")
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
                if 0 in x.shape[1:]:
                    raise DataError(f"{p}: array {features_key!r} has shape {x.shape}: samples without features; "
                                    f"expected at least one feature per sample")
        elif suffix == ".npy":
            expect_npy(p)
            arr = np.load(p, allow_pickle=False)
            if not isinstance(arr, np.ndarray):  # an .npz archive under an .npy name
                arr.close()
                raise DataError(f"{p}: holds an .npz archive, not one array; rename it to .npz and name its "
                                f"arrays with features_key and labels_key")
            arr = _real(arr, p, "the array")
            if arr.ndim != 2 or arr.shape[1] < 2:
                raise DataError(f"{p}: expected a 2-D array (samples x columns, at least 2), got shape {arr.shape}")
            lc = label_column % arr.shape[1]
            x, y = np.delete(arr, lc, axis=1).astype(np.float64), arr[:, lc]
        else:
            parsed = read_table(p, columns["delimiter"], header=header, label_column=label_column,
                                target=columns["target"], features=columns["features"],
                                categorical=columns["categorical"], task=task)
            x, y, lines, names, target = parsed.x, parsed.y, parsed.lines, parsed.names, parsed.target
    except DataError:
        raise
    except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
        hint = " (it holds pickled objects, which dlrun never loads)" if "pickle" in str(e) else ""
        raise DataError(f"{p}: cannot read the file{hint}: {e}") from None
    if not (y.ndim == 1 or (task == "regression" and y.ndim == 2)) or len(x) != len(y):
        expected = f"({len(x)},) or ({len(x)}, outputs) for regression" if task == "regression" else f"({len(x)},)"
        raise DataError(f"{p}: {len(x)} feature rows but labels of shape {y.shape}; expected {expected}")
    if len(x) == 0:
        raise DataError(f"{p}: the file holds no samples")
    ds = Dataset(x, np.zeros(len(x), dtype=np.int64), name=str(p), rows=lines, columns=names, target=target)
    numbers = x.numbers if isinstance(x, table.Table) else x
    bad = np.isinf(numbers).reshape(len(x), -1).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{ds.where(i)}: features contain inf ({int(bad.sum())} sample"
                        f"{'s' if bad.sum() > 1 else ''} in all)")
    if y.dtype.kind == "U":  # class names (a CSV's): mapped to indices by data.load_data
        ds.y = y
        return ds
    try:
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{p}: labels of dtype {y.dtype} are not numbers") from None
    ds.y = _labels(y, task, ds.where)
    return ds
