"""What a failed tensor's numbers say about the bug: a sign, a constant factor, a transpose.

A FAIL names the worst element; the usual hand-written backward bugs leave a pattern over all of
them that names the bug itself. Backward's gradient a and the finite differences n, at every
element compared at one point, are tested for:

* a = c·n for one constant c (least squares, residual within ``FIT`` of ‖n‖): c = −1 is a sign
  flipped; any other c a missing or extra factor (the 2 of a square, the 1/N of a mean);
* a = nᵀ for a square matrix (not itself symmetric): a transposed product, xᵀ·dy for dyᵀ·x;
* a = 0 where n is not: a gradient never written (or written to a copy);
* failures confined to a few indices of one axis (rows or columns of a weight matrix).

Each finding is one line (a note of the tensor, a :class:`Pattern`); nothing is said when no
pattern fits. A pattern is a guess about backward's formula: when the layer does not repeat itself
at one point (aux reentrant or state fails), the runner withdraws it (gradcheck.aux.attribute).
"""
from __future__ import annotations

import numpy as np

FIT = 1e-2  # relative residual below which a pattern "fits": float32 noise is ~1e-6, a bug ~1
FEW = 3  # at most this many indices of an axis, for "confined to"


class Pattern(str):
    """A note that guesses the bug from the numbers' pattern (a factor, a sign, a transpose)."""


def describe(name: str, shape: tuple, a: np.ndarray, n: np.ndarray, flat: np.ndarray, bad: np.ndarray) -> str | None:
    """One line naming the pattern of ``name``'s failure, or None. ``a``, ``n``: analytic and
    numeric values (float64) at the flat indices ``flat`` of a tensor of ``shape``; ``bad``:
    which of them fail."""
    scale = float(np.linalg.norm(n))
    if flat.size < 2 or not bad.any() or not np.isfinite(scale):
        return None
    if scale > 0 and not a.any():
        return Pattern(f"backward's gradient for {name} is 0 at every element compared, finite differences are "
                       f"not: it is never written (or written to a copy, or the cache it reads is empty)")
    if scale == 0:
        return None
    c = float(np.dot(a, n)) / scale ** 2
    if abs(c - 1) > 5 * FIT and np.linalg.norm(a - c * n) <= FIT * abs(c) * scale and np.count_nonzero(n) >= 2:
        return Pattern(_factor(name, c))
    found = _transposed(name, shape, a, n, flat) or _confined(name, shape, flat[bad], flat.size, int(bad.sum()))
    return None if found is None else Pattern(found)


def _factor(name: str, c: float) -> str:
    if abs(c + 1) <= FIT:
        return (f"backward's gradient for {name} is the negative of the finite differences at every element: "
                f"a sign is flipped")
    k = round(c) if abs(c) >= 1 else round(1 / c)
    exact = abs((c if abs(c) >= 1 else 1 / c) - k) <= FIT * abs(k)
    shown = (f"{k}" if abs(c) >= 1 else f"1/{k}") if exact and k != 0 else f"{c:.4g}"
    return (f"backward's gradient for {name} is {shown} × the finite differences at every element: a constant "
            f"factor is missing or extra (the 2 of a square, the 1/N of a mean over the batch, a scale option)")


def _transposed(name: str, shape: tuple, a, n, flat) -> str | None:
    if len(shape) != 2 or shape[0] != shape[1] or flat.size != shape[0] * shape[1] or shape[0] < 2:
        return None
    A, N = np.empty(flat.size), np.empty(flat.size)
    A[flat], N[flat] = a, n
    A, N = A.reshape(shape), N.reshape(shape)
    norm = float(np.linalg.norm(N))
    if np.linalg.norm(A - N.T) <= FIT * norm and np.linalg.norm(N - N.T) > 10 * FIT * norm:
        return (f"backward's gradient for {name} is the transpose of the finite differences: a transposed "
                f"product (xᵀ·dy where dyᵀ·x belongs, or the reverse)")
    return None


def _confined(name: str, shape: tuple, failing: np.ndarray, compared: int, count: int) -> str | None:
    """Failures at a few indices of one axis only (the rows of some classes, one column)."""
    if len(shape) < 2:
        return None
    where = np.unravel_index(failing, shape)
    for axis, extent in enumerate(shape):
        idx = np.unique(where[axis])
        if idx.size <= min(FEW, extent // 3):  # (most of the axis passes)
            at = ", ".join(map(str, idx.tolist()))
            return (f"{count} of the {compared} elements compared fail, all at index {at} of axis {axis} (of "
                    f"{extent}): only the code for those is wrong (a branch, an index that repeats)")
    return None
