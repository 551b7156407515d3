"""Losses over class scores: softmax cross-entropy (fused; one kernel set on GPU) and NLL."""
from __future__ import annotations

import numpy as np

from ..backend import array_module, fused_elementwise, out_args
from ..registry import losses
from .base import Loss

_FEW_CLASSES = 16  # up to this many columns, column-wise ufuncs beat an axis-1 reduction


@losses.register()
class SoftmaxCrossEntropy(Loss):
    """L = -(1/N) Σ_i log softmax(z_i)[y_i], fused and numerically stable; ∂L/∂z = (p - onehot(y))/N.

    Takes raw scores (logits) of shape (N, C) and integer labels of shape (N,). The softmax is
    computed with the row maximum subtracted, so large logits never overflow.
    """

    task = "classification"

    def forward(self, z, y):
        xp = array_module(z)
        if xp is not np:
            return self._forward_fused(xp, z, y)
        n, c = z.shape
        get = self.buffers.get
        fold = c <= _FEW_CLASSES  # CPU: C-1 ufunc calls beat one axis-1 reduction (on GPU each is a launch)
        m = _row_reduce(xp, xp.maximum, z, get(xp, "m", (n,), z.dtype)) if fold else z.max(axis=1)
        p = xp.subtract(z, m[:, None], out=get(xp, "p", z.shape, z.dtype))
        xp.exp(p, out=p)
        s = _row_reduce(xp, xp.add, p, get(xp, "s", (n,), z.dtype)) if fold else p.sum(axis=1)
        # p = exp(z - m) is normalised in backward, where it is scaled by 1/N anyway: d = p·(1/(N s))
        self._r = xp.divide(1.0 / n, s, out=get(xp, "r", (n,), z.dtype))
        # flat index of (i, y_i): 1-D take/setitem are ~4x cheaper than [rows, y]
        flat = xp.add(self.buffers.constant(xp, ("row_starts", n, c), lambda: xp.arange(0, n * c, c)), y,
                      out=get(xp, "flat", (n,), y.dtype))
        self._p, self._flat = p, flat
        # log-sum-exp form: -log p_y = log Σ exp(z - m) - (z_y - m); never log(0)
        xp.log(s, out=s)
        s += m
        s -= z.reshape(-1).take(flat)
        return s.sum() * (1.0 / n)  # ndarray.mean() costs ~3x more Python for small arrays

    def _forward_fused(self, xp, z, y):
        """GPU: the same log-sum-exp in five launches; p holds exp(z − m), normalised in backward."""
        n, c = z.shape
        z = xp.ascontiguousarray(z)  # the nll kernel reads z by flat index
        m = z.max(axis=1, keepdims=True)
        p = fused_elementwise(xp, "T z, T m", "T p", "p = exp(z - m);", "dlrun_sce_exp")(
            z, m, *out_args(self.buffers.get(xp, "p", z.shape, z.dtype)))
        s = p.sum(axis=1)
        # per-sample −log p_y = log Σ exp(z − m) − (z_y − m), reading z_y from the raw logits
        nll = fused_elementwise(xp, "T s, T m, Y y, raw T z, int32 c", "T out",
                                "out = log(s) + m - z[i * c + y];", "dlrun_sce_nll")(s, m.reshape(-1), y, z, c)
        self._p, self._s, self._y = p, s, y
        return nll.sum() * (1.0 / n)

    def backward(self):
        xp = array_module(self._p)
        scale = 1.0 / self._p.shape[0]  # a Python float keeps float32 float32
        if xp is not np:
            n, c = self._p.shape
            return fused_elementwise(xp, "T p, T s, Y y, int32 c, T scale", "T d",
                                     "d = (p / s - ((Y)(i % c) == y ? (T)1 : (T)0)) * scale;", "dlrun_sce_grad")(
                self._p, self._s[:, None], self._y[:, None], c, scale,
                *out_args(self.buffers.get(xp, "d", self._p.shape, self._p.dtype)))
        d = xp.multiply(self._p, self._r[:, None], out=self.buffers.get(xp, "d", self._p.shape, self._p.dtype))
        d.reshape(-1)[self._flat] -= scale  # d is contiguous: the reshape is a view
        return d

    def probabilities(self, z):
        xp = array_module(z)
        p = xp.exp(z - z.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)



def _row_reduce(xp, ufunc, z, out):
    """ufunc folded over the columns of z (N, C): C-1 cheap calls instead of one axis-1 reduction."""
    if z.shape[1] == 1:
        if out is None:
            return z[:, 0].copy()
        out[...] = z[:, 0]
        return out
    out = ufunc(z[:, 0], z[:, 1], out=out)
    for j in range(2, z.shape[1]):
        ufunc(out, z[:, j], out=out)
    return out


@losses.register()
class NLL(Loss):
    """L = −(1/N) Σ_i z_i[y_i], the negative log-likelihood of log-probabilities; ∂L/∂z_ij = −[j = y_i]/N.

    Takes log-probabilities of shape (N, C), normally from a final LogSoftmax layer (the pair
    equals SoftmaxCrossEntropy), and integer labels (N,). ``--proba`` gives exp(z).
    """

    task = "classification"

    def forward(self, z, y):
        xp = array_module(z)
        rows = xp.arange(z.shape[0])
        self._shape, self._rows, self._y, self._dtype = z.shape, rows, y, z.dtype
        return -z[rows, y].mean()

    def backward(self):
        xp = array_module(self._y)
        d = xp.zeros(self._shape, dtype=self._dtype)
        d[self._rows, self._y] = -1.0 / self._shape[0]
        return d

    def probabilities(self, z):
        return array_module(z).exp(z)
