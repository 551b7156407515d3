"""MinMaxNormalization: seed 001's NormalizationLayer, rescaling the batch into [0, 1]."""
from __future__ import annotations

from ..registry import layers
from .base import InputSpec, Layer


def minmax_forward(x):
    """(y, cache) for y = (x − m)/(M − m), m = min x and M = max x over the whole batch."""
    flat = x.reshape(-1)
    imin, imax = int(flat.argmin()), int(flat.argmax())
    m, r = flat[imin], flat[imax] - flat[imin]
    if r == 0:  # a constant batch: output 0 (and gradient 0) instead of 0/0
        return x * 0, (imin, imax, None, None)
    y = (x - m) / r
    return y, (imin, imax, y, r)


def minmax_backward(dy, cache):
    """∂L/∂x = G/r, plus Σ G(y−1)/r at argmin and −Σ G·y/r at argmax (r = M − m)."""
    imin, imax, y, r = cache
    if y is None:
        return dy * 0
    dx = dy / r
    flat = dx.reshape(-1)
    flat[imin] += (dy * (y - 1)).sum() / r
    flat[imax] -= (dy * y).sum() / r
    return dx


@layers.register()
class MinMaxNormalization(Layer):
    """y = (x − min x) / (max x − min x), with min and max over the whole batch.

    As in the MXNet tutorial (seed 001) the extremes are taken over every element of the
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
