"""Samples read from a memory-mapped .npy file a batch at a time, so that data larger than memory
trains in bounded memory: :class:`Rows` stands where a feature array would, and the trainer
reads each batch from it (rows gathered in file order, then put in the batch's order)."""
from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from ..errors import DataError

PIECE_BYTES = 1 << 24  # what reading a whole column (the labels) copies at a time


class MappedFile:
    """The array of an .npy file, mapped read-only: the OS reads pages from disk when rows are read
    and keeps them in its file cache, from which it drops them when memory is short (they count
    in the process's resident size while mapped, but are neither private nor swapped)."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
            if dtype.hasobject:
                raise DataError(f"{path}: the array holds Python objects (pickled), which dlrun never loads; save "
                                f"numbers")
            size = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            f.seek(0, 2)
            if f.tell() < size:
                raise DataError(f"{path}: the file is cut short: {f.tell():,} bytes, its header promises {size:,}")
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.array = np.ndarray(shape, dtype, buffer=self.map, offset=offset, order="F" if fortran else "C") \
            if size else np.empty(shape, dtype)
        self.path = path

    def rows(self, index) -> np.ndarray:
        """Rows ``index`` (a slice, or ascending positions) of the array, copied out of the map."""
        out = self.array[index]
        return out.copy() if isinstance(index, slice) else out


class Rows:
    """Rows of the features of a mapped 2-D array (every column but the label column), read on
    demand as float64: ``rows[i]``, ``rows[a:b]`` and ``rows[positions]`` return host arrays as
    the same index of the in-memory feature array would. ``index`` selects and orders the rows
    of the file (a validation split's training part), ascending."""

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, source: MappedFile, label_column: int | None, index: np.ndarray | None = None):
        self.source, self.label_column, self.index = source, label_column, index
        width = source.array.shape[1]
        self.columns = width if label_column is None else width - 1
        self.shape = (len(source.array) if index is None else len(index), self.columns)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def subset(self, positions: np.ndarray) -> Rows:
        """The rows at ascending ``positions`` of these rows, still on disk."""
        positions = np.asarray(positions, dtype=np.int64)
        return Rows(self.source, self.label_column, positions if self.index is None else self.index[positions])

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            return self[np.array([key])][0]
        if isinstance(key, slice):
            if self.index is None and key.step in (None, 1):
                return self._features(self.source.rows(slice(*key.indices(len(self))[:2])))
            key = np.arange(*key.indices(len(self)))
        positions = np.asarray(key)
        if positions.dtype == bool:
            positions = np.flatnonzero(positions)
        at = positions if self.index is None else self.index[positions]
        order = np.argsort(at, kind="stable")  # read the file front to back, then put rows in the asked order
        out = np.empty((len(at), self.columns))
        out[order] = self._features(self.source.rows(at[order]))
        return out

    def _features(self, rows: np.ndarray) -> np.ndarray:
        lc = self.label_column
        if lc is None:
            return rows.astype(np.float64, copy=False)
        lc %= rows.shape[1]
        if lc in (0, rows.shape[1] - 1):
            rows = rows[:, 1:] if lc == 0 else rows[:, :-1]
        else:
            rows = np.delete(rows, lc, axis=1)
        return np.ascontiguousarray(rows, dtype=np.float64)

    def labels(self) -> np.ndarray:
        """The label column of these rows, read a piece at a time (into memory: one number a row)."""
        lc = self.label_column % self.source.array.shape[1]
        step = max(1, PIECE_BYTES // max(1, self.source.array.shape[1] * self.source.array.dtype.itemsize))
        out = np.empty(len(self), dtype=self.source.array.dtype)
        for s in range(0, len(self), step):
            part = slice(s, s + step) if self.index is None else self.index[s:s + step]
            out[s:s + step] = self.source.rows(part)[:, lc]
        return out

    def __array__(self, dtype=None, copy=None):
        """All the rows in memory (what code that needs the whole array gets)."""
        out = self[:]
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"Rows({self.source.path}, {self.shape[0]} x {self.shape[1]}, memory-mapped)"
