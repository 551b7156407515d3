"""Vectorised reading of numeric CSV text: blocks of the file parsed by pyarrow's CSV reader (when
installed) or numpy's ``loadtxt``, straight into one float64 array.

It takes only plain files: ASCII numbers separated by the delimiter, one sample per line, no
quotes, no NUL bytes, no lone CR, every line shorter than the longest cell Python's csv module
accepts. Anything else (and any cell or row the block parser refuses: a blank line, a missing
value, a name) answers None, and the caller reads the file row by row with the csv module, which
gives the same numbers for every file the fast path takes and names the line and column of each
problem.
"""
from __future__ import annotations

import csv
import functools
import io
from pathlib import Path

import numpy as np

BLOCK = 1 << 24  # bytes surveyed at a time
PARSE_BLOCK = {"numpy": 1 << 22, "pyarrow": 1 << 23}  # bytes parsed at a time (pyarrow's threads share one)
DELIMITERS = (",", ";", "\t", "|")  # the delimiters the fast path takes (the csv module takes any character)


def have_pyarrow() -> bool:
    """Whether pyarrow's CSV reader can be imported (the ``arrow`` extra)."""
    return _pyarrow() is not None


@functools.cache
def _pyarrow():
    """(pyarrow, pyarrow.csv), or None where pyarrow is not installed."""
    try:  # (deferred: an optional dependency, and a tenth of a second to import)
        import pyarrow
        import pyarrow.csv
    except ImportError:
        return None
    return pyarrow, pyarrow.csv


class Plain:
    """What the fast path needs to know about a file before parsing it: where the samples start
    (the byte after the header line, if any) and the column count."""

    def __init__(self, start: int, first_line: int, width: int, rows: int):
        self.start, self.first_line, self.width, self.rows = start, first_line, width, rows


def survey(path: Path, header: bool, delimiter: str, bom: int, longest: int) -> Plain | None:
    """One pass over the file's bytes in blocks: the sample count when every line is a plain row
    (see the module docstring), else None. ``bom``: bytes of byte order mark to skip;
    ``longest``: the longest line the fast path takes."""
    d = delimiter.encode()
    with open(path, "rb") as f:
        f.seek(bom)
        start = bom
        if header:
            start += len(f.readline(longest + 1))
        first = f.readline(longest + 1)
        if not first.strip():
            return None
        width = first.count(d) + 1
        f.seek(start)
        rows, carry = 0, b""
        while True:
            block = f.read(BLOCK)
            data = carry + block
            if not block:
                if data:
                    data += b"\n"  # the last line without its line break
                else:
                    break
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) > longest:
                    return None
                carry = data
                continue
            lines, carry = data[:cut], data[cut:]
            if not _plain(lines, longest):
                return None
            rows += lines.count(b"\n")
            if not block:
                break
    return Plain(start, 2 if header else 1, width, rows) if rows else None


def _plain(lines: bytes, longest: int) -> bool:
    """Whether whole lines ``lines`` hold only what the block parsers read as the exact scan does
    (blank lines and cells the parsers refuse are found by the parse itself)."""
    if not lines.isascii() or b"\0" in lines or b'"' in lines:
        return False
    if b"\r" in lines and lines.count(b"\r") != lines.count(b"\r\n"):  # a lone CR ends a line for csv
        return False
    pos, n = 0, len(lines)
    while n - pos > longest + 1:  # jump from line to line a window at a time: no per-line work
        end = lines.rfind(b"\n", pos, pos + longest + 1)
        if end < 0:
            return False
        pos = end + 1
    return True


def read(path: Path, plain: Plain, delimiter: str, parser: str) -> np.ndarray | None:
    """The numbers (rows, columns) of a surveyed file, or None when a block parser refuses a cell
    or a row's column count (the exact scan then names it)."""
    width = plain.width
    out = np.empty((plain.rows, width))
    parse = _arrow_block if parser == "pyarrow" else _numpy_block
    size = min(BLOCK, PARSE_BLOCK[parser])
    at = 0
    with open(path, "rb") as f:
        f.seek(plain.start)
        carry = b""
        while True:
            block = f.read(size)
            data = carry + block
            cut = data.rfind(b"\n") + 1 if block else len(data)
            lines, carry = data[:cut], data[cut:]
            if lines:
                n = lines.count(b"\n") + (not lines.endswith(b"\n"))
                if at + n > plain.rows:
                    return None  # the file grew since the survey
                parsed = parse(lines, delimiter, width)
                if parsed is None or parsed.shape != (n, width):
                    return None
                out[at:at + n] = parsed
                at += n
            if not block:
                break
    return out if at == plain.rows else None


def _numpy_block(lines: bytes, delimiter: str, width: int) -> np.ndarray | None:
    try:
        return np.loadtxt(io.StringIO(lines.decode("ascii")), delimiter=delimiter, comments=None,
                          dtype=np.float64, ndmin=2, quotechar=None)
    except ValueError:
        return None


def _arrow_block(lines: bytes, delimiter: str, width: int) -> np.ndarray | None:
    pa, pc = _pyarrow()
    names = [f"c{j}" for j in range(width)]
    try:  # (the system allocator: pyarrow's own would keep the blocks' memory after the read)
        table = pc.read_csv(pa.BufferReader(lines), memory_pool=pa.system_memory_pool(),
                            read_options=pc.ReadOptions(column_names=names),
                            parse_options=pc.ParseOptions(delimiter=delimiter, quote_char=False, escape_char=False,
                                                          ignore_empty_lines=False),
                            convert_options=pc.ConvertOptions(column_types={c: pa.float64() for c in names},
                                                              null_values=[], strings_can_be_null=False,
                                                              quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    out = np.empty((table.num_rows, width))
    for j, column in enumerate(table.columns):
        if column.null_count:
            return None
        out[:, j] = column.to_numpy()
    return out


def longest_line() -> int:
    """The longest line the fast path takes: one no longer than the csv module's cell limit cannot
    hold a cell beyond it."""
    return csv.field_size_limit()
