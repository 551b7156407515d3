"""Checks of a whole data set a piece at a time: their temporaries (np.abs, np.isnan of the
features) are the size of a piece, not of the array, and memory-mapped samples
(:class:`~dlrun.data.mapped.Rows`) are read from their file a piece at a time."""
from __future__ import annotations

import numpy as np

SCAN_BYTES = 1 << 23  # the piece of an array a check reads at a time: its temporaries stay this small


def row_blocks(x, budget: int | None = None):
    """(first row, rows as a host array) of ``x`` in consecutive pieces of about ``budget`` bytes
    (SCAN_BYTES): checks of a whole data set make temporaries of one piece, not of the array."""
    n = len(x)
    row = x.dtype.itemsize * int(np.prod(x.shape[1:], dtype=np.int64))
    step = max(1, (budget or SCAN_BYTES) // max(1, row))
    for s in range(0, n, step):
        yield s, np.asarray(x[s:s + step])


def first_row(x, bad) -> int | None:
    """The first row of ``x`` for which ``bad(rows)`` (rows × ... → bool per row) is true, read a
    piece at a time, or None."""
    for s, block in row_blocks(x):
        hit = bad(block.reshape(len(block), -1))
        if hit.any():
            return s + int(np.flatnonzero(hit)[0])
    return None


def magnitudes(x) -> np.ndarray:
    """The largest absolute value of each feature of ``x`` (N, ...), flattened."""
    x = x if hasattr(x, "dtype") else np.asarray(x)
    top = np.zeros(int(np.prod(x.shape[1:], dtype=np.int64)))
    for _, block in row_blocks(x):
        if len(block):
            np.maximum(top, np.abs(block.reshape(len(block), -1)).max(axis=0), out=top)
    return top
