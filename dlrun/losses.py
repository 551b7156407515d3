"""Loss functions: ``forward(z, y) -> scalar`` (mean over the batch) and ``backward() -> dz``.

``task`` tells the trainer how to score predictions: "classification" (integer labels,
accuracy from argmax) or "regression".
"""
from __future__ import annotations

from .backend import array_module
from .buffers import BufferPool
from .registry import losses

_FEW_CLASSES = 16  # up to this many columns, column-wise ufuncs beat an axis-1 reduction


class Loss:
    """Base class for losses."""

    task = "classification"

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self.buffers = BufferPool()  # enabled by the trainer while it owns the gradients (see dlrun.buffers)
        return self

    def forward(self, z, y):
        raise NotImplementedError

    def backward(self):
        raise NotImplementedError

    def predict(self, z):
        """Turn model outputs into the values ``dlrun predict`` reports (class index or value)."""
        return z.argmax(axis=1) if self.task == "classification" else z

    def probabilities(self, z):
        """Class probabilities for ``--proba`` (classification losses only)."""
        raise NotImplementedError(f"{type(self).__name__} gives no probabilities")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


losses.base = Loss


@losses.register()
class SoftmaxCrossEntropy(Loss):
    """L = -(1/N) Σ_i log softmax(z_i)[y_i], fused and numerically stable; ∂L/∂z = (p - onehot(y))/N.

    Takes raw scores (logits) of shape (N, C) and integer labels of shape (N,). The softmax is
    computed with the row maximum subtracted, so large logits never overflow.
    """

    task = "classification"

    def forward(self, z, y):
        xp = array_module(z)
        n, c = z.shape
        get = self.buffers.get
        m = _row_reduce(xp, xp.maximum, z, get(xp, "m", (n,), z.dtype)) if c <= _FEW_CLASSES else z.max(axis=1)
        p = xp.subtract(z, m[:, None], out=get(xp, "p", z.shape, z.dtype))
        xp.exp(p, out=p)
        s = _row_reduce(xp, xp.add, p, get(xp, "s", (n,), z.dtype)) if c <= _FEW_CLASSES else p.sum(axis=1)
        p /= s[:, None]
        flat = xp.arange(0, n * c, c)  # flat index of (i, y_i): 1-D take/setitem are ~4x cheaper than [rows, y]
        flat += y
        self._p, self._flat = p, flat
        # log-sum-exp form: -log p_y = log Σ exp(z - m) - (z_y - m); never log(0)
        xp.log(s, out=s)
        s += m
        s -= z.reshape(-1).take(flat)
        return s.sum() * (1.0 / n)  # ndarray.mean() costs ~3x more Python for small arrays

    def backward(self):
        xp = array_module(self._p)
        scale = 1.0 / self._p.shape[0]  # a Python float keeps float32 float32
        d = xp.multiply(self._p, scale, out=self.buffers.get(xp, "d", self._p.shape, self._p.dtype))
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
class MSE(Loss):
    """L = (1/(N·K)) Σ (z - y)², the mean squared error; ∂L/∂z = 2 (z - y)/(N·K).

    Targets ``y`` have the shape of the output, or (N,) for a single output.
    """

    task = "regression"

    def forward(self, z, y):
        y = y.reshape(z.shape)
        d = z - y
        self._d = d
        return (d * d).mean()

    def backward(self):
        return self._d * (2.0 / self._d.size)
