"""Loss functions: ``forward(z, y) -> scalar`` (mean over the batch) and ``backward() -> dz``.

``task`` tells the trainer how to score predictions: "classification" (integer labels,
accuracy from argmax) or "regression".
"""
from __future__ import annotations

import numpy as np

from .backend import array_module, fused_elementwise
from .errors import ShapeError
from .options import PositiveFloat
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

    def check_outputs(self, classes: int, outputs: int) -> str | None:
        """Why labels 0..classes−1 cannot be scored from ``outputs`` model outputs, or None."""
        if classes > outputs:
            return (f"has labels up to {classes - 1}, but the model outputs {outputs} scores "
                    f"(set the last layer's units to {classes})")
        return None

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
        if xp is not np:
            return self._forward_fused(xp, z, y)
        get = self.buffers.get
        fold = c <= _FEW_CLASSES  # CPU: C-1 ufunc calls beat one axis-1 reduction (on GPU each is a launch)
        m = _row_reduce(xp, xp.maximum, z, get(xp, "m", (n,), z.dtype)) if fold else z.max(axis=1)
        p = xp.subtract(z, m[:, None], out=get(xp, "p", z.shape, z.dtype))
        xp.exp(p, out=p)
        s = _row_reduce(xp, xp.add, p, get(xp, "s", (n,), z.dtype)) if fold else p.sum(axis=1)
        p /= s[:, None]
        flat = xp.arange(0, n * c, c)  # flat index of (i, y_i): 1-D take/setitem are ~4x cheaper than [rows, y]
        flat += y
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
            z, m, *_out(self.buffers.get(xp, "p", z.shape, z.dtype)))
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
                *_out(self.buffers.get(xp, "d", self._p.shape, self._p.dtype)))
        d = xp.multiply(self._p, scale, out=self.buffers.get(xp, "d", self._p.shape, self._p.dtype))
        d.reshape(-1)[self._flat] -= scale  # d is contiguous: the reshape is a view
        return d

    def probabilities(self, z):
        xp = array_module(z)
        p = xp.exp(z - z.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)


def _out(buffer) -> tuple:
    """A fused kernel's output argument: the pooled buffer, or none (the kernel allocates)."""
    return () if buffer is None else (buffer,)


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


def _sigmoid(z):
    """σ(z) without overflow: exp(−|z|) lies in (0, 1]."""
    xp = array_module(z)
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(z.dtype, copy=False)


@losses.register()
class BinaryCrossEntropy(Loss):
    """L = (1/N) Σ_i max(z_i, 0) − z_i·y_i + log(1 + exp(−|z_i|)), the logistic loss on logits; ∂L/∂z = (σ(z) − y)/N.

    This equals −(1/N) Σ [y log σ(z) + (1 − y) log(1 − σ(z))] but never takes log(0) or
    overflows exp, whatever the size of z. Takes one raw score (logit) per sample, shape (N, 1)
    or (N,), and labels 0/1 of shape (N,) (targets in [0, 1] work too). Predicts class 1 when
    z > 0; ``--proba`` gives the two columns (1 − σ(z), σ(z)).
    """

    task = "classification"

    def _flat(self, z):
        if z.ndim > 2 or (z.ndim == 2 and z.shape[1] != 1):
            raise ShapeError(f"BinaryCrossEntropy takes one logit per sample, shape (N, 1), got outputs of shape "
                             f"{tuple(z.shape)}; set the last layer's units to 1, or use SoftmaxCrossEntropy")
        return z.reshape(z.shape[0])

    def forward(self, z, y):
        xp = array_module(z)
        zf = self._flat(z)
        yf = y.reshape(zf.shape).astype(z.dtype, copy=False)
        self._shape, self._z, self._y = z.shape, zf, yf
        return (xp.maximum(zf, 0) - zf * yf + xp.log1p(xp.exp(-xp.abs(zf)))).mean()

    def backward(self):
        d = _sigmoid(self._z)
        d -= self._y
        d /= d.shape[0]
        return d.reshape(self._shape)

    def predict(self, z):
        return (self._flat(z) > 0).astype("int64")

    def probabilities(self, z):
        p = _sigmoid(self._flat(z))
        return array_module(z).stack([1 - p, p], axis=1)

    def check_outputs(self, classes, outputs):
        if classes > 2:
            return (f"has labels up to {classes - 1}, but BinaryCrossEntropy takes labels 0 and 1 "
                    f"(use SoftmaxCrossEntropy for more classes)")
        if outputs != 1:
            return f"is scored by BinaryCrossEntropy, which takes one logit per sample, but the model outputs {outputs} (set the last layer's units to 1)"
        return None


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


@losses.register()
class Hinge(Loss):
    """L = (1/N) Σ_i Σ_{j≠y_i} max(0, z_ij − z_iy_i + margin), the multi-class hinge (Weston–Watkins) loss.

    Every wrong class whose score comes within ``margin`` of the true class's score adds to the
    loss (the cs231n multi-class SVM loss; Crammer–Singer would count only the largest one).
    ∂L/∂z_ij = [m_ij > 0]/N for j ≠ y_i and −Σ_j [m_ij > 0]/N for j = y_i, where m_ij is the
    term inside max (its kink at 0 takes the zero branch). Gives no probabilities.

    Args:
        margin: the score gap Δ the true class should keep over every other class.
    """

    task = "classification"

    def __init__(self, margin: PositiveFloat = 1.0):
        self.margin = margin

    def forward(self, z, y):
        xp = array_module(z)
        rows = xp.arange(z.shape[0])
        m = z - z[rows, y][:, None]
        m += self.margin
        m[rows, y] = 0
        xp.maximum(m, 0, out=m)
        self._m, self._rows, self._y = m, rows, y
        return m.sum(axis=1).mean()

    def backward(self):
        d = (self._m > 0).astype(self._m.dtype)
        d[self._rows, self._y] = -d.sum(axis=1)
        d /= d.shape[0]
        return d

    def __repr__(self) -> str:
        return f"Hinge(margin={self.margin})"


@losses.register()
class Huber(Loss):
    """L = (1/(N·K)) Σ h(z − y), h(d) = d²/2 for |d| ≤ δ else δ(|d| − δ/2); ∂L/∂z = clip(z − y, −δ, δ)/(N·K).

    Quadratic near the target and linear beyond δ, so outliers pull less than with MSE (as
    torch.nn.HuberLoss). Targets have the shape of the output, or (N,) for a single output.

    Args:
        delta: δ, where the loss turns from quadratic to linear.
    """

    task = "regression"

    def __init__(self, delta: PositiveFloat = 1.0):
        self.delta = delta

    def forward(self, z, y):
        xp = array_module(z)
        d = z - y.reshape(z.shape)
        a = xp.abs(d)
        self._d = d
        return xp.where(a <= self.delta, 0.5 * d * d, self.delta * (a - 0.5 * self.delta)).mean()

    def backward(self):
        xp = array_module(self._d)
        return xp.clip(self._d, -self.delta, self.delta) * (1.0 / self._d.size)

    def __repr__(self) -> str:
        return f"Huber(delta={self.delta})"
