"""Losses over class scores: softmax cross-entropy (fused; one kernel set on GPU) and NLL."""
from __future__ import annotations

from typing import Annotated

import numpy as np

from ..backend import Kernel, array_module, out_args
from ..registry.options import Range
from ..registry import losses
from .base import ClassWeights, Loss, weighted_sum, weights_option

# the C function that np.count_nonzero calls for a whole array, without its two Python layers
# (numpy 2: ~0.2 us less a call; numpy 1 keeps np.count_nonzero)
_count_nonzero = getattr(getattr(np, "_core", None), "multiarray", np).count_nonzero

_FEW_CLASSES = 16  # up to this many columns, column-wise ufuncs beat an axis-1 reduction
# GPU: p = exp(z − m); per-sample −log p_y = log Σ exp(z − m) − (z_y − m), z_y read from the raw
# logits; and the gradient (p/s − t)/N, t = on where the column is y, else off (label smoothing)
_EXP = Kernel("T z, T m", "T p", "p = exp(z - m);", "dlrun_sce_exp")
_NLL = Kernel("T s, T m, Y y, raw T z, int32 c", "T out", "out = log(s) + m - z[i * c + y];", "dlrun_sce_nll")
_GRAD = Kernel("T p, T s, Y y, int32 c, T scale, T on, T off", "T d",
               "d = (p / s - ((Y)(i % c) == y ? on : off)) * scale;", "dlrun_sce_grad")


@losses.register()
class SoftmaxCrossEntropy(Loss):
    """L = -(1/N) Σ_i Σ_j t_ij log softmax(z_i)_j, fused and numerically stable; ∂L/∂z = (p - t)/N.

    Takes raw scores (logits) of shape (N, C) and integer labels of shape (N,). The target t is
    onehot(y), or with label smoothing ε the mixture (1 − ε)·onehot(y) + ε/C (as
    torch.nn.CrossEntropyLoss(label_smoothing=ε) and Keras' CategoricalCrossentropy). The
    softmax is computed with the row maximum subtracted, so large logits never overflow.

    With ``class_weights`` w, sample i counts w[y_i] times: L = (1/N) Σ_i w[y_i]·ℓ_i and
    ∂L/∂z_i = w[y_i]·(p_i − t_i)/N (Keras' ``class_weight``; PyTorch's ``weight=`` divides by
    Σ_i w[y_i] instead of N).

    Args:
        label_smoothing: ε in [0, 1], the share of each target spread evenly over all C classes
            (0.1 is common); 0 is plain cross-entropy. Accuracy and predictions are unchanged.
        class_weights: one weight ≥ 0 per class, e.g. ``[1, 5]`` to count the samples of a rare
            class 1 five times; ``balanced``: n / (C·n_k) from the training labels (written into
            the run's config); null weights every sample 1.
    """

    task = "classification"
    _work = _scored = _pooled = None  # the CPU forward's arrays, the (z, y) they were computed for

    def __init__(self, label_smoothing: Annotated[float, Range(0, 1)] = 0.0, class_weights: ClassWeights = None):
        self.label_smoothing = float(label_smoothing)
        self.class_weights = weights_option(class_weights)

    def forward(self, z, y):
        xp = array_module(z)
        if y.dtype.itemsize < 8:  # labels index n·c flat scores: narrow ones (uint8) would wrap
            y = y.astype(np.int64)
        if _EXP.on(xp) is not None:  # GPU
            return self._forward_fused(xp, z, y)
        w = self._pooled  # the pool's arrays for the last logits seen: in the training loop z is
        # the last layer's reused buffer, so the same array (its shape and dtype with it) and its views
        if not (w is not None and z is w.z and y.dtype is w.label_dtype and self.buffers.enabled):
            n, c = z.shape
            w = self.buffers.group(("sce", n, c, z.dtype, y.dtype), lambda: _Work(n, c, z.dtype, y.dtype))
            self._pooled = w if self.buffers.enabled else None
            w.z, w.z_cols = z, _Columns(z) if w.few else None
            w.z_flat = z.reshape(-1) if z.flags.c_contiguous else None  # a copy would go stale
        self._work = w
        m, s, n = w.m, w.s, w.n
        # (the ufuncs get their output positionally, ufunc(a, b, out), not as out=out and not as
        # s += m: the same loop, ~50 ns less Python per call, a tenth of a small call)
        if w.few:  # CPU: C-1 ufunc calls over columns beat one axis-1 reduction
            _fold(np.maximum, w.z_cols, m)
        else:
            z.max(axis=1, out=m)
        p = np.subtract(z, w.m_col, w.p)
        np.exp(p, p)
        if w.few:
            _fold(np.add, w.p_cols, s)
        else:
            p.sum(axis=1, out=s)
        # p = exp(z - m) is normalised in backward, where it is scaled by 1/N anyway: d = p·(1/(N s))
        np.divide(w.inv_n, s, w.r)  # (1/N as a scalar of the scores' type: the same value, a faster call)
        # flat index of (i, y_i): 1-D take/setitem are ~4x cheaper than [rows, y]
        np.add(w.row_starts, y, w.flat)
        # log-sum-exp form: -log p_y = log Σ exp(z - m) - (z_y - m); never log(0)
        np.log(s, s)
        np.add(s, m, s)
        zy = (w.z_flat if w.z_flat is not None else z.reshape(-1)).take(w.flat, None, w.zy)  # (axis, out)
        eps = self.label_smoothing
        if eps:  # -Σ_j t_j log p_j = lse - (1 - ε)·z_y - (ε/C)·Σ_j z_j
            np.multiply(z.sum(axis=1, out=w.zsum), eps / w.c, out=w.zsum)
            s -= w.zsum
            s -= np.multiply(zy, 1.0 - eps, out=w.zsum)
        else:
            np.subtract(s, zy, s)
        self._scored = (z, y)
        self._wy = None if self.class_weights is None else self.sample_weights(y, z, out=w.wy)
        if self._wy is not None:  # each sample's loss and gradient row count w[y_i] times
            s *= self._wy
            w.r *= self._wy
        return np.add.reduce(s) * (1.0 / n)  # ndarray.mean() and .sum() cost more Python for small arrays

    def count_correct(self, z, y):
        """argmax(z) == y counted from the forward's row maxima (CPU), ~1.4x cheaper than argmax.

        Exact, ties included: exp(z - m) is exactly 1 at a row maximum (and, rarely, within
        rounding of it), so when n entries of p equal 1 every row has a single maximum, and
        the prediction is right iff z_y equals the row maximum. Otherwise (ties, NaN) argmax."""
        w = self._work
        if w is None or self._scored[0] is not z or self._scored[1] is not y:
            return super().count_correct(z, y)
        # one comparison does both: p and z_y lie end to end in one array, 1 and m in another
        np.equal(w.p_zy, w.ones_m, w.equal)
        right = _count_nonzero(w.right)  # z_y == m
        if _count_nonzero(w.equal) - right == w.n:  # p == 1 once per row
            return right
        return super().count_correct(z, y)

    def _forward_fused(self, xp, z, y):
        """GPU: the same log-sum-exp in five launches; p holds exp(z − m), normalised in backward."""
        n, c = z.shape
        z = xp.ascontiguousarray(z)  # the nll kernel reads z by flat index
        m = z.max(axis=1, keepdims=True)
        p = _EXP.on(xp)(z, m, *out_args(self.buffers.get(xp, "p", z.shape, z.dtype)))
        s = p.sum(axis=1)
        nll = _NLL.on(xp)(s, m.reshape(-1), y, z, c)
        self._p, self._s, self._y, self._work, self._scored = p, s, y, None, None
        self._wy = wy = self.sample_weights(y, z)
        eps = self.label_smoothing
        if eps:  # (1 − ε)·(lse − z_y) + ε·(lse − mean_j z_j), lse = log s + m
            nll *= 1.0 - eps
            nll += eps * (xp.log(s) + m.reshape(-1) - z.mean(axis=1))
        return (1.0 / n) * (nll.sum() if wy is None else weighted_sum(xp, nll, wy))

    def backward(self):
        if self._work is None:  # GPU
            xp = array_module(self._p)
            scale = 1.0 / self._p.shape[0]  # a Python float keeps float32 float32
            if self._wy is not None:  # row i scaled by w[y_i]/N
                scale = (scale * self._wy)[:, None]
            n, c = self._p.shape
            off = self.label_smoothing / c
            return _GRAD.on(xp)(
                self._p, self._s[:, None], self._y[:, None], c, scale, 1.0 - self.label_smoothing + off, off,
                *out_args(self.buffers.get(xp, "d", self._p.shape, self._p.dtype)))
        w = self._work
        np.multiply(w.p, w.r_col, w.d)  # r: w[y_i]/(N s_i) with class weights
        n, c = w.d.shape
        eps = self.label_smoothing
        if self._wy is not None:  # t_i scaled by w[y_i] too
            wn = np.multiply(self._wy, 1.0 / n, out=w.wn)
            if eps:
                w.d -= np.multiply(wn, eps / c, out=w.wt)[:, None]
            w.d_flat[w.flat] -= np.multiply(wn, 1.0 - eps, out=w.wt)
            return w.d
        if eps:  # every target gets ε/C, the label's (1 − ε) on top
            w.d -= eps / (c * n)
        w.d_flat[w.flat] -= (1.0 - eps) / n if eps else w.inv_n  # d_flat is a view of d; a Python float keeps float32
        return w.d

    def probabilities(self, z):
        xp = array_module(z)
        p = xp.exp(z - z.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)

    def __repr__(self) -> str:
        opts = [f"label_smoothing={self.label_smoothing}"] if self.label_smoothing else []
        return f"SoftmaxCrossEntropy({', '.join(filter(None, opts + [self._weights_repr()]))})"


class _Work:
    """The CPU forward/backward arrays for one (N, C, dtypes): made together, looked up once.

    Views that every call would otherwise slice anew (column views, broadcast columns, the
    flat view of d) are made here too."""

    def __init__(self, n: int, c: int, dtype, label_dtype):
        self.s, self.r, self.zsum = (np.empty(n, dtype) for _ in range(3))
        self.wy, self.wn, self.wt = (np.empty(n, dtype) for _ in range(3))  # class weights' w[y], w[y]/N, scratch
        # count_correct compares p with 1 and z_y with m in one call: p then z_y in one array, as
        # many ones then m in another
        self.p_zy, self.ones_m, self.equal = np.empty(n * c + n, dtype), np.ones(n * c + n, dtype), \
            np.empty(n * c + n, bool)
        self.p, self.zy, self.m = self.p_zy[:n * c].reshape(n, c), self.p_zy[n * c:], self.ones_m[n * c:]
        self.right = self.equal[n * c:]
        self.d = np.empty((n, c), dtype)
        self.m_col, self.r_col = self.m[:, None], self.r[:, None]
        self.p_cols = _Columns(self.p)
        self.d_flat = self.d.reshape(-1)
        self.flat = np.empty(n, label_dtype)
        self.row_starts = np.arange(0, n * c, c, dtype=label_dtype)
        self.n, self.c, self.few, self.label_dtype = n, c, c <= _FEW_CLASSES, np.dtype(label_dtype)
        self.inv_n = np.dtype(dtype).type(1.0 / n)  # 1/N rounded to the dtype, as numpy rounds a Python float
        self.z, self.z_cols, self.z_flat = None, None, None  # views of the last logits seen


class _Columns:
    """The column views of an (N, C) array, split as a fold takes them: the first two and the rest."""

    def __init__(self, a):
        cols = [a[:, j] for j in range(a.shape[1])]
        self.first, self.second, self.rest = cols[0], cols[1] if len(cols) > 1 else None, cols[2:]


def _fold(ufunc, cols: _Columns, out):
    """ufunc folded over the columns (C-1 cheap calls instead of one axis-1 reduction)."""
    if cols.second is None:
        out[...] = cols.first
        return
    ufunc(cols.first, cols.second, out=out)  # (np.maximum takes no positional output)
    for col in cols.rest:
        ufunc(out, col, out=out)


@losses.register()
class NLL(Loss):
    """L = −(1/N) Σ_i z_i[y_i], the negative log-likelihood of log-probabilities; ∂L/∂z_ij = −[j = y_i]/N.

    Takes log-probabilities of shape (N, C), normally from a final LogSoftmax layer (the pair
    equals SoftmaxCrossEntropy), and integer labels (N,). ``--proba`` gives exp(z).

    Args:
        class_weights: one weight ≥ 0 per class: sample i counts w[y_i] times,
            L = −(1/N) Σ_i w[y_i]·z_i[y_i] (as SoftmaxCrossEntropy's, ``balanced`` too); null
            weights every sample 1.
    """

    task = "classification"

    def __init__(self, class_weights: ClassWeights = None):
        self.class_weights = weights_option(class_weights)

    def forward(self, z, y):
        xp = array_module(z)
        rows = xp.arange(z.shape[0])
        self._shape, self._rows, self._y, self._dtype = z.shape, rows, y, z.dtype
        self._wy = self.sample_weights(y, z)
        picked = z[rows, y]
        return -picked.mean() if self._wy is None else -weighted_sum(xp, picked, self._wy) * (1.0 / len(picked))

    def backward(self):
        xp = array_module(self._y)
        d = xp.zeros(self._shape, dtype=self._dtype)
        scale = -1.0 / self._shape[0]
        d[self._rows, self._y] = scale if self._wy is None else self._wy * scale
        return d

    def probabilities(self, z):
        return array_module(z).exp(z)
