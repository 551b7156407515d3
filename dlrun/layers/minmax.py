"""MinMaxNormalization: the MXNet custom-layer tutorial's NormalizationLayer, rescaling the batch into [0, 1]."""
from __future__ import annotations

import math

from ..backend import array_module
from ..registry import layers
from .base import InputSpec, Layer


def minmax_forward(x):
    """(y, cache) for y = (x − m)/(M − m), m = min x and M = max x over the whole batch.

    Everything stays on the device (no host read of the extremes): a constant batch (M = m)
    gets the factor 0 instead of 1/(M − m), so its output and gradient are 0, not 0/0.
    """
    xp = array_module(x)
    flat = x.reshape(-1)
    imin, imax = flat.argmin(), flat.argmax()
    m = flat[imin]
    r = flat[imax] - m
    constant = xp.equal(r, 0)
    inv = xp.where(constant, x.dtype.type(0), xp.true_divide(x.dtype.type(1), xp.where(constant, x.dtype.type(1), r)))
    y = (x - m) * inv
    return y, (imin, imax, y, inv)


def runner_up_gap(a, axis: int = 0):
    """The largest value minus the second largest along ``axis``: how far the argmax is from
    moving (inf with one value; -inf entries, max-pool padding, never win)."""
    xp = array_module(a)
    if a.shape[axis] < 2:
        return xp.full(a.shape[:axis] + a.shape[axis + 1:], math.inf)
    top = xp.moveaxis(xp.sort(a, axis=axis), axis, -1)  # gradcheck only: the arrays are small
    return top[..., -1] - top[..., -2]


def minmax_kink_distance(x):
    """Distance to a kink of min-max normalisation: the argmax or argmin moving. Closing a
    gap between two values takes a step of norm gap/√2 (one up, the other down)."""
    flat = x.reshape(-1)
    xp = array_module(x)
    return xp.true_divide(xp.minimum(runner_up_gap(flat), runner_up_gap(-flat)), math.sqrt(2))


def minmax_backward(dy, cache):
    """∂L/∂x = G/r, plus Σ G(y−1)/r at argmin and −Σ G·y/r at argmax (r = M − m)."""
    imin, imax, y, inv = cache
    # C order, so that flat is a view: dy * inv keeps dy's layout, and reshape(-1) of a
    # Fortran-ordered or strided dx would be a copy that takes the two writes below
    xp = array_module(dy)
    dx = xp.ascontiguousarray(dy * inv)
    flat = dx.reshape(-1)
    flat[imin] += (dy * xp.subtract(y, 1)).sum() * inv
    flat[imax] -= (dy * y).sum() * inv
    return dx


@layers.register()
class MinMaxNormalization(Layer):
    """y = (x − min x) / (max x − min x), with min and max over the whole batch.

    As in the MXNet custom-layer tutorial the extremes are taken over every element of the
    batch, so the output spans exactly [0, 1]. Backward: ∂y_e/∂x_e = 1/r, and the elements at
    the argmin and argmax also receive Σ_e G_e(y_e − 1)/r and −Σ_e G_e·y_e/r, where
    r = max x − min x. A constant batch gives 0 (and gradient 0). The kinks are where the
    argmin or argmax moves; ``branch_signature`` is that pair.
    """

    input_spec = InputSpec(shape=("D", "C"))

    def forward(self, x, y=None):
        out, self._cache = minmax_forward(x)
        return out

    def backward(self, dy):
        return minmax_backward(dy, self._cache)

    def branch_signature(self):
        return self._cache[:2]

    def kink_distance(self, x, y=None):
        return minmax_kink_distance(x)
