"""Loss functions: ``forward(z, y) -> scalar`` (mean over the batch) and ``backward() -> dz``.

``task`` tells the trainer how to score predictions: "classification" (integer labels,
accuracy from argmax) or "regression".
"""
from __future__ import annotations

from .backend import array_module
from .registry import losses


class Loss:
    """Base class for losses."""

    task = "classification"

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
        n = z.shape[0]
        rows = xp.arange(n)
        shifted = z - z.max(axis=1, keepdims=True)
        p = xp.exp(shifted)
        s = p.sum(axis=1, keepdims=True)
        p /= s
        self._p, self._y, self._rows = p, y, rows
        # log-sum-exp form: -log p_y = log Σ exp(z - m) - (z_y - m); never log(0)
        return (xp.log(s[:, 0]) - shifted[rows, y]).mean()

    def backward(self):
        d = self._p.copy()
        d[self._rows, self._y] -= 1
        d /= d.shape[0]
        return d

    def probabilities(self, z):
        xp = array_module(z)
        p = xp.exp(z - z.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)


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
