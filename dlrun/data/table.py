"""Rows of CSV text as named columns: the header, the target and feature columns by name, numeric
and categorical (text) columns, missing cells and string class labels, with errors that name the
file, line and column. Each column is converted at once (no loop over rows but on an error)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DataError
from ..registry.options import did_you_mean

# cells that mean "no value" (as pandas reads them); a missing value is filled or refused by
# data.preprocess.missing
MISSING = ("", "NA", "N/A", "NaN", "nan", "null", "NULL", "?")
DELIMITERS = (";", "\t", "|", ",")


@dataclass
class Table:
    """Feature columns by name before preprocessing: ``numbers`` (N, k) float64 for the numeric
    columns (NaN where missing), ``text`` (N, m) str for the categorical ones ("" where missing),
    in the order ``names`` gives them (``categorical[j]`` says which)."""

    names: list[str]
    categorical: list[bool]
    numbers: np.ndarray
    text: np.ndarray

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, index) -> "Table":
        return Table(self.names, self.categorical, self.numbers[index], self.text[index])

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), len(self.names))

    @property
    def numeric_names(self) -> list[str]:
        return [n for n, c in zip(self.names, self.categorical) if not c]

    @property
    def text_names(self) -> list[str]:
        return [n for n, c in zip(self.names, self.categorical) if c]


@dataclass
class Parsed:
    """A CSV's columns: features (a float array when every feature is numeric, else a
    :class:`Table`), labels (float or str, or None), each row's file line, feature names
    (None without a header), and the target column's name."""

    x: object
    y: np.ndarray | None
    lines: np.ndarray
    names: list[str] | None
    target: str | None


def is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def delimiter_hint(path, rows: list, delimiter: str) -> str:
    """'; the file seems to separate columns with ';': set data.delimiter: ";"' when a
    first row split by ``delimiter`` leaves another delimiter inside its cells, else ''."""
    cells = [c for r in rows[:5] for c in r]
    for d in DELIMITERS:
        if d != delimiter and cells and sum(d in c for c in cells) >= max(1, len(cells) // 2):
            shown = "\\t" if d == "\t" else d
            return f"; the file seems to separate columns with {shown!r}: set data.delimiter: {shown!r}"
    return ""


def first_is_header(cells: list[str]) -> bool:
    """Whether a first row is a header: some cell is neither a number nor a missing value."""
    return not all(is_number(c) or c.strip() in MISSING for c in cells)


def parse(path, rows: list[list[str]], lines: list[int], *, header: bool | None = None,
          label_column: int | None = -1, target: str | None = None, features: list[str] | None = None,
          categorical: list[str] | None = None, task: str = "classification", delimiter: str = ",",
          values: np.ndarray | None = None, value_lines: np.ndarray | None = None) -> Parsed:
    """Interpret a CSV's rows (each a list of cells, with its file line): find the header, the
    target and the feature columns, convert numeric columns to float64 (missing cells NaN) and
    keep categorical columns as text. ``label_column``/``target`` None: no labels (prediction
    inputs). A feature column not listed in ``categorical`` holds numbers.

    ``values`` (N, columns) and ``value_lines``: every data row already read as numbers, all of
    one width (:mod:`dlrun.data.fastcsv`); ``rows`` then holds the header row, if any, and the
    first data row."""
    if not rows:
        raise DataError(f"{path}: the file has no rows")
    named = target is not None or features is not None or categorical is not None
    if header is None:  # sniff: a first row that is not all numbers is a header
        header = first_is_header(rows[0])
    if named and not header:
        what = "target" if target is not None else "features" if features is not None else "categorical"
        raise DataError(f"{path}:{lines[0]}: data.{what} names columns, but the file has no header row "
                        f"(its first row holds numbers); name columns by their place with label_column, or add a header")
    start = 1 if header else 0
    if (len(rows) <= start) if values is None else not len(values):
        raise DataError(f"{path}: the file has a header row but no data rows")
    width = len(rows[start])
    names = [c.strip() for c in rows[0]] if header else [f"column {j + 1}" for j in range(width)]
    if header and len(names) != width:
        raise DataError(f"{path}:{lines[start]}: expected {len(names)} columns (as in the header, line {lines[0]}), "
                        f"got {width}{delimiter_hint(path, rows, delimiter)}")
    if header:
        seen = set()
        for j, n in enumerate(names):
            if n in seen:
                raise DataError(f"{path}:{lines[0]}: column {j + 1}: the header names {n!r} twice; give each column "
                                f"its own name")
            seen.add(n)
    wanted = 2 if (target is not None or label_column is not None) else 1
    if width < wanted:
        raise DataError(f"{path}:{lines[start]}: expected at least {wanted} columns (features and a label), got "
                        f"{width}{delimiter_hint(path, rows, delimiter)}")
    widths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    bad = np.flatnonzero(widths[start:] != width) if values is None else np.flatnonzero(widths[start:start + 1] != width)
    if bad.size:
        k = int(bad[0]) + start
        raise DataError(f"{path}:{lines[k]}: expected {width} columns (as in line {lines[start]}), got "
                        f"{len(rows[k])}{delimiter_hint(path, rows[k:k + 1], delimiter)}")
    at = _column_finder(path, lines[0], names)
    lc = None
    if target is not None:
        lc = at(target, "target")
    elif label_column is not None:
        if not -width <= label_column < width:
            raise DataError(f"{path}: label_column {label_column} is out of range for {width} columns")
        lc = label_column % width
    if features is not None:
        cols = [at(f, "features") for f in features]
        if lc in cols:
            raise DataError(f"{path}: data.features lists {names[lc]!r}, the target column; a column is either a "
                            f"feature or the target")
    else:
        cols = [j for j in range(width) if j != lc]
    cat = set(at(c, "categorical") for c in categorical or ())
    stray = [names[j] for j in cat if j not in cols]
    if stray:
        raise DataError(f"{path}: data.categorical names {stray[0]!r}, which is not a feature column")
    line_of = np.asarray(lines[start:], dtype=np.int64) if values is None else value_lines
    if not cat:  # a file of numbers: converted at once, without a text copy of every cell
        if values is None:
            try:
                values = np.array(rows[start:], dtype=np.float64)
            except ValueError:  # a missing cell, a class name, or a cell that is no number: by columns, below
                values = None
        if values is not None:
            y = None if lc is None else _labels(path, values[:, lc], "", line_of, task)
            return Parsed(_columns(values, cols), y, line_of,
                          [names[j] for j in cols] if header else None,
                          names[lc] if (header and lc is not None) else None)
    cells = np.char.strip(np.array(rows[start:], dtype=str))
    if cells.ndim == 1:  # (a file of one column and no label)
        cells = cells[:, None]
    numeric = [j for j in cols if j not in cat]
    numbers = _numbers(path, cells, numeric, names, line_of, header)
    x: object
    if cat:
        text_cols = [j for j in cols if j in cat]
        text = np.where(np.isin(cells[:, text_cols], MISSING), "", cells[:, text_cols])
        x = Table([names[j] for j in cols], [j in cat for j in cols], numbers, text)
    else:
        x = numbers
    y = None if lc is None else _labels(path, cells[:, lc], repr(names[lc]) if header else str(lc + 1), line_of, task)
    return Parsed(x, y, line_of, [names[j] for j in cols] if header else None, names[lc] if (header and lc is not None) else None)


def _columns(values: np.ndarray, cols: list[int]) -> np.ndarray:
    """``values[:, cols]``: a view, not a copy, when the columns are consecutive (every column but
    a first or last label column)."""
    if cols == list(range(cols[0], cols[-1] + 1)) if cols else False:
        return values[:, cols[0]:cols[-1] + 1]
    return values[:, cols]


def _column_finder(path, header_line: int, names: list[str]):
    """A function from a column's name to its index, raising a DataError naming the config key."""
    index = {n: j for j, n in enumerate(names)}

    def at(name, key: str) -> int:
        if name not in index:
            raise DataError(f"{path}:{header_line}: data.{key}: no column {name!r} in the header"
                            f"{did_you_mean(str(name), names)}; the columns are {', '.join(names)}")
        return index[name]
    return at


def _numbers(path, cells: np.ndarray, cols: list[int], names: list[str], lines: np.ndarray,
             header: bool) -> np.ndarray:
    """The numeric feature columns as float64 (N, len(cols)), missing cells NaN; a cell that is
    not a number is named by file, line and column."""
    block = cells[:, cols]
    missing = np.isin(block, MISSING)
    try:
        out = np.where(missing, "nan", block).astype(np.float64)
    except ValueError:
        for k, j in enumerate(cols):  # find the cell (an error path: one column at a time)
            try:
                np.where(missing[:, k], "nan", block[:, k]).astype(np.float64)
            except ValueError:
                bad = np.flatnonzero(~np.vectorize(is_number, otypes=[bool])(block[:, k]) & ~missing[:, k])
                i = int(bad[0])
                hint = f" (column {names[j]!r}: list it in data.categorical if it holds categories)" if header else ""
                raise DataError(f"{path}:{int(lines[i])}: column {j + 1}: expected a number, got "
                                f"{str(block[i, k])!r}{hint}") from None
        raise
    return out


def _labels(path, cells: np.ndarray, name: str, lines: np.ndarray, task: str) -> np.ndarray:
    """The target column (``name``: its quoted name, or its number): float64 numbers, or the cells
    as str when any is not a number (class names, classification only). A missing label is
    refused (a "nan" is a number, which the loader refuses as a label)."""
    if cells.dtype.kind == "f":  # (already numbers)
        return cells
    missing = np.isin(cells, [m for m in MISSING if m.lower() != "nan"])
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise DataError(f"{path}:{int(lines[i])}: column {name}: the label is missing; every row needs one")
    try:
        return cells.astype(np.float64)
    except ValueError:
        if task == "regression":
            i = int(np.flatnonzero(~np.vectorize(is_number, otypes=[bool])(cells))[0])
            raise DataError(f"{path}:{int(lines[i])}: column {name}: expected a number as the regression target, "
                            f"got {str(cells[i])!r}") from None
    return cells.astype(str)


def encode_labels(y: np.ndarray, classes: list[str], where, column: str | None) -> np.ndarray:
    """Class names -> class indices in ``classes`` (sorted); a name not among them is named with
    ``where(i)`` (file:line) and its column."""
    names = np.asarray(classes, dtype=str)
    y = np.asarray(y).astype(str)
    idx = np.searchsorted(names, y)
    ok = idx < len(names)
    ok[ok] = names[idx[ok]] == y[ok]
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        col = f"column {column!r}: " if column else ""
        raise DataError(f"{where(i)}: {col}label {str(y[i])!r} was not seen in training (classes: "
                        f"{', '.join(classes)})")
    return idx.astype(np.int64)
