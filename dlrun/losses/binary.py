"""Binary cross-entropy on logits and the multi-class hinge loss."""
from __future__ import annotations

import math
from typing import Literal

import numpy as np

from ..backend import array_module
from ..errors import ShapeError
from ..registry.options import PositiveFloat
from ..registry import losses
from .base import ClassWeights, Loss, weighted_sum, weights_option


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

    Args:
        class_weights: ``[w0, w1]``: a sample of label 0 counts w0 times, one of label 1 w1 times
            (a target y in between, w0 + (w1 − w0)·y); the loss and its gradient are scaled per
            sample, still divided by N. ``balanced``: n / (2·n_k) from the training labels, a
            soft target counting y towards class 1. null weights every sample 1.
    """

    task = "classification"

    def __init__(self, class_weights: ClassWeights = None):
        self.class_weights = weights_option(class_weights)

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
        terms = xp.maximum(zf, 0) - zf * yf + xp.log1p(xp.exp(-xp.abs(zf)))
        self._wy = None
        if self.resolved_weights() is not None:  # w0 + (w1 − w0)·y: w[y] for labels 0 and 1
            w0, w1 = self.class_weights
            self._wy = yf * (w1 - w0) + w0  # Python floats keep float32 float32
            terms *= self._wy
        return terms.mean()

    def backward(self):
        # σ(z) − y as (1 − y)·σ(z) − y·σ(−z): for y = 1 and large z, σ(z) − 1 cancels to 0 in
        # float32 (from z ≈ 17) while −σ(−z) keeps its value; both from one exp(−|z|)
        xp, z, y = array_module(self._z), self._z, self._y
        e = xp.exp(-xp.abs(z))
        inv = 1 / (1 + e)
        e *= inv  # σ(−|z|)
        pos = xp.greater_equal(z, 0)
        d = (1 - y) * xp.where(pos, inv, e)
        d -= y * xp.where(pos, e, inv)
        d /= d.shape[0]
        if self._wy is not None:
            d *= self._wy
        return d.reshape(self._shape)

    def predict(self, z):
        return array_module(z).greater(self._flat(z), 0).astype("int64")

    def probabilities(self, z):
        p = _sigmoid(self._flat(z))
        return array_module(z).stack([1 - p, p], axis=1)

    def classes(self, outputs):
        return 2  # one logit scores labels 0 and 1

    def class_counts(self, y, classes):
        y = np.asarray(y, dtype=np.float64).ravel()  # a soft target y counts 1 − y for class 0 and y for class 1
        return np.array([len(y) - y.sum(), y.sum()])

    def check_outputs(self, classes, outputs):
        if classes > 2:
            return (f"has labels up to {classes - 1}, but BinaryCrossEntropy takes labels 0 and 1 "
                    f"(use SoftmaxCrossEntropy for more classes)")
        if outputs != 1:
            return f"is scored by BinaryCrossEntropy, which takes one logit per sample, but the model outputs {outputs} (set the last layer's units to 1)"
        return None


@losses.register()
class Hinge(Loss):
    """L = (1/N) Σ_i Σ_{j≠y_i} max(0, z_ij − z_iy_i + margin), the multi-class hinge (Weston–Watkins) loss.

    Every wrong class whose score comes within ``margin`` of the true class's score adds to the
    loss (the cs231n multi-class SVM loss; Crammer–Singer would count only the largest one).
    ∂L/∂z_ij = [m_ij > 0]/N for j ≠ y_i and −Σ_j [m_ij > 0]/N for j = y_i, where m_ij is the
    term inside max (its kink at 0 takes the zero branch). Gives no probabilities.

    PyTorch's MultiMarginLoss also divides each sample's sum by C, the number of classes: by
    default this loss and its gradient are C times PyTorch's, so a recipe ported from PyTorch
    trains here at C times its effective learning rate. ``class_reduction: mean`` gives
    PyTorch's L = (1/(N·C)) Σ_i Σ_{j≠y_i} max(0, z_ij − z_iy_i + margin) and its gradient;
    with ``class_weights`` w it is MultiMarginLoss(weight=w, margin=margin).

    Args:
        margin: the score gap Δ the true class should keep over every other class.
        class_weights: one weight ≥ 0 per class: sample i's terms and gradient count w[y_i]
            times (still divided by N); ``balanced``: n / (C·n_k) from the training labels; null
            weights every sample 1.
        class_reduction: how a sample's terms combine: ``sum`` over the wrong classes (cs231n),
            or ``mean``: that sum divided by C, the number of classes (PyTorch's MultiMarginLoss).
    """

    task = "classification"

    def __init__(self, margin: PositiveFloat = 1.0, class_weights: ClassWeights = None,
                 class_reduction: Literal["sum", "mean"] = "sum"):
        self.margin = margin
        self.class_weights = weights_option(class_weights)
        self.class_reduction = class_reduction

    def forward(self, z, y):
        xp = array_module(z)
        rows = xp.arange(z.shape[0])
        m = z - z[rows, y][:, None]
        m += self.margin
        m[rows, y] = 0
        xp.maximum(m, 0, out=m)
        self._m, self._rows, self._y = m, rows, y
        self._wy = self.sample_weights(y, z)
        per_sample = m.sum(axis=1)
        if self.class_reduction == "mean":
            per_sample /= z.shape[1]
        return per_sample.mean() if self._wy is None else (1.0 / len(per_sample)) * weighted_sum(xp, per_sample, self._wy)

    def backward(self):
        d = array_module(self._m).greater(self._m, 0).astype(self._m.dtype)
        d[self._rows, self._y] = -d.sum(axis=1)
        n = d.shape[0] * (d.shape[1] if self.class_reduction == "mean" else 1)  # N, or N·C
        if self._wy is None:
            d /= n
        else:
            d *= (self._wy * (1.0 / n))[:, None]
        return d

    def kink_distance(self, z, y):
        """|m_ij| / √2 for j ≠ y_i: m_ij = z_ij − z_iy_i + margin moves with two scores."""
        xp = array_module(z)
        rows = xp.arange(z.shape[0])
        m = abs(z - z[rows, y][:, None] + self.margin)
        m[rows, y] = math.inf
        return m / math.sqrt(2)

    def __repr__(self) -> str:
        reduction = ", class_reduction='mean'" if self.class_reduction == "mean" else ""
        return f"Hinge(margin={self.margin}{', ' + self._weights_repr() if self.class_weights else ''}{reduction})"
