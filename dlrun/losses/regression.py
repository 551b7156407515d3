"""Regression losses: mean squared error and Huber."""
from __future__ import annotations

from ..backend import array_module
from ..registry.options import PositiveFloat
from ..registry import losses
from .base import Loss


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
        return (2.0 / self._d.size) * self._d


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
        return xp.where(xp.less_equal(a, self.delta), 0.5 * d * d, self.delta * xp.subtract(a, 0.5 * self.delta)).mean()

    def backward(self):
        xp = array_module(self._d)
        return (1.0 / self._d.size) * xp.clip(self._d, -self.delta, self.delta)

    def __repr__(self) -> str:
        return f"Huber(delta={self.delta})"
