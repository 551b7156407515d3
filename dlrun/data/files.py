"""The ``file`` data loader: features and labels from a CSV, .npy or .npz file, with errors that
name the file and line (a row of a CSV, the array of an archive)."""
from __future__ import annotations

import codecs
import csv
import zipfile
from pathlib import Path
from typing import Literal

import numpy as np

from . import Dataset, fastcsv, table
from .mapped import MappedFile, Rows
from .pieces import first_row, row_blocks
from ..backend import host_memory_available
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


def read_table(path: Path, delimiter: str = ",", csv_parser: str = "auto", **options) -> table.Parsed:
    """A CSV's feature columns, labels and lines (:func:`dlrun.data.table.parse` takes the options).

    A file of numbers alone is parsed in blocks by :mod:`dlrun.data.fastcsv` (``csv_parser``:
    "pyarrow", "numpy", or "auto" for pyarrow when it is installed); any other file, and any file
    the block parser refuses (a missing cell, a name, quotes, a ragged row), is read row by row
    with Python's csv module (``csv_parser="python"`` asks for it alone), which gives the same
    numbers and names the line and column of each problem."""
    if csv_parser != "python" and not options.get("categorical"):
        refuse_binary(path)
        fast = _read_fast(path, delimiter, options.get("header"),
                          "pyarrow" if csv_parser == "auto" and fastcsv.have_pyarrow() else
                          "numpy" if csv_parser == "auto" else csv_parser)
        if fast is not None:
            head, head_lines, values, lines = fast
            try:
                return table.parse(path, head, head_lines, delimiter=delimiter, values=values, value_lines=lines,
                                   **options)
            except DataError:  # (named below as the row-by-row scan names it)
                del values
    rows, lines = read_rows(path, delimiter)
    return table.parse(path, rows, lines, delimiter=delimiter, **options)


def _read_fast(path: Path, delimiter: str, header: bool | None, parser: str):
    """(the header row's and first data row's cells, their lines, every data row's numbers, their
    lines) from the block parsers, or None for the row-by-row scan to read the file."""
    if delimiter not in fastcsv.DELIMITERS:
        return None
    longest = fastcsv.longest_line()
    with open(path, "rb") as f:
        first, second = f.readline(longest + 1), f.readline(longest + 1)
    bom = len(codecs.BOM_UTF8) if first.startswith(codecs.BOM_UTF8) else 0
    head = [first[bom:]] + ([second] if second else [])
    if any(not line.strip() or b'"' in line or b"\0" in line or len(line) > longest for line in head):
        return None
    try:
        head = [line.decode("utf-8").rstrip("\r\n").split(delimiter) for line in head]
    except UnicodeDecodeError:
        return None
    if header is None:  # sniff, as table.parse does
        header = table.first_is_header(head[0])
    if len(head) < 1 + header:  # (a header without data rows)
        return None
    plain = fastcsv.survey(path, header, delimiter, bom, longest)
    if plain is None:
        return None
    values = fastcsv.read(path, plain, delimiter, parser)
    if values is None:
        return None
    lines = np.arange(plain.first_line, plain.first_line + plain.rows, dtype=np.int64)
    return head[:1 + header], [1, 2][:1 + header], values, lines


def read_csv(path: Path, label_column: int | None, header: bool | None, delimiter: str = ",",
             csv_parser: str = "auto"):
    """(features, labels or None, file line of each row) of a CSV of numbers; errors name the
    file and line."""
    parsed = read_table(path, delimiter, csv_parser, header=header, label_column=label_column)
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


def split_columns(arr: np.ndarray, label_column: int):
    """(features as float64, labels) of a 2-D array whose column ``label_column`` holds the
    labels: a view, not a copy, when that column is the first or the last of float64 numbers."""
    lc = label_column % arr.shape[1]
    if lc in (0, arr.shape[1] - 1):
        x = arr[:, 1:] if lc == 0 else arr[:, :-1]
    else:
        x = np.delete(arr, lc, axis=1)
    return x.astype(np.float64, copy=False), arr[:, lc]


def _maps(p: Path, memory_map: bool | None) -> bool:
    """Whether to map the .npy file ``p`` rather than read it: as asked, or (None) when it is larger
    than half the memory the OS can still give."""
    if memory_map is not None:
        return memory_map
    free = host_memory_available()
    return free is not None and p.stat().st_size > free // 2


def _is_zip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(2) == b"PK"


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
              delimiter: str = ",", csv_parser: Literal["auto", "pyarrow", "numpy", "python"] = "auto",
              memory_map: bool | None = None) -> Dataset:
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
        csv_parser: what parses a CSV of numbers: "pyarrow" (its multi-threaded C++ reader; pip
            install 'dlrun[arrow]'), "numpy" (numpy.loadtxt), "auto" (pyarrow when installed, else
            numpy) or "python" (Python's csv module, row by row: slow). Every one gives the same
            numbers; a file the first two cannot read (a missing cell, a category, quoted cells)
            is read by the python one, which names the line and column of each problem.
        memory_map: read an .npy file's samples from the file a batch at a time (numpy's
            mmap_mode), for data larger than memory; the default maps a file larger than half the
            memory available. Training gives the same results either way.
    """
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    if len(delimiter) != 1 or delimiter in "\"\r\n":
        raise OptionError(f"expected one character that is not a quote or line break, such as ',' or ';', "
                          f"got {delimiter!r}", option="delimiter")
    if csv_parser == "pyarrow" and not fastcsv.have_pyarrow():
        raise OptionError("pyarrow needs the pyarrow package (pip install 'dlrun[arrow]'); csv_parser: numpy "
                          "reads the same numbers without it", option="csv_parser")
    columns = {"target": target, "features": features, "categorical": categorical, "delimiter": delimiter,
               "csv_parser": csv_parser, "memory_map": memory_map}
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
                x = (x[:, None] if x.ndim == 1 else x).astype(np.float64, copy=False)  # 1-D: one feature per sample
                if 0 in x.shape[1:]:
                    raise DataError(f"{p}: array {features_key!r} has shape {x.shape}: samples without features; "
                                    f"expected at least one feature per sample")
        elif suffix == ".npy" and _maps(p, columns["memory_map"]):
            expect_npy(p)
            if _is_zip(p):
                raise DataError(f"{p}: holds an .npz archive, not one array; rename it to .npz and name its "
                                f"arrays with features_key and labels_key")
            source = MappedFile(p)
            arr = _real(source.array, p, "the array")
            if arr.ndim != 2 or arr.shape[1] < 2:
                raise DataError(f"{p}: expected a 2-D array (samples x columns, at least 2), got shape {arr.shape}")
            x = Rows(source, label_column)
            y = x.labels()
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
            x, y = split_columns(arr, label_column)
        elif columns["memory_map"]:
            raise DataError(f"{p}: memory_map reads .npy files only (save the array with numpy.save); "
                            f"a {suffix or 'file without a suffix'} is read into memory")
        else:
            parsed = read_table(p, columns["delimiter"], columns["csv_parser"], header=header, label_column=label_column,
                                target=columns["target"], features=columns["features"],
                                categorical=columns["categorical"], task=task)
            x, y, lines, names, target = parsed.x, parsed.y, parsed.lines, parsed.names, parsed.target
    except DataError:
        raise
    except MemoryError:
        hint = ("memory_map: true reads it a batch at a time" if suffix == ".npy" else
                "saved as an .npy file (numpy.save), memory_map: true reads it a batch at a time")
        raise DataError(f"{p}: not enough memory to read the file ({p.stat().st_size:,} bytes); {hint}") from None
    except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
        hint = " (it holds pickled objects, which dlrun never loads)" if "pickle" in str(e) else ""
        raise DataError(f"{p}: cannot read the file{hint}: {e}") from None
    if not (y.ndim == 1 or (task == "regression" and y.ndim == 2)) or len(x) != len(y):
        expected = f"({len(x)},) or ({len(x)}, outputs) for regression" if task == "regression" else f"({len(x)},)"
        raise DataError(f"{p}: {len(x)} feature rows but labels of shape {y.shape}; expected {expected}")
    if len(x) == 0:
        raise DataError(f"{p}: the file holds no samples")
    ds = Dataset(x, np.zeros(len(x), dtype=np.int64), name=str(p), rows=lines, columns=names, target=target,
                 owned=True)
    numbers = x.numbers if isinstance(x, table.Table) else x
    i = first_row(numbers, lambda b: np.isinf(b).any(axis=1))  # (a piece at a time)
    if i is not None:
        bad = sum(int(np.isinf(b).reshape(len(b), -1).any(axis=1).sum()) for _, b in row_blocks(numbers))
        raise DataError(f"{ds.where(i)}: features contain inf ({bad} sample{'s' if bad > 1 else ''} in all)")
    if y.dtype.kind == "U":  # class names (a CSV's): mapped to indices by data.load_data
        ds.y = y
        return ds
    try:
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{p}: labels of dtype {y.dtype} are not numbers") from None
    ds.y = _labels(y, task, ds.where)
    return ds
