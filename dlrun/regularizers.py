"""Weight penalties added to the loss: attach per layer (``weight_regularizer``) or run-wide.

A regularizer gives ``penalty(w)`` (a scalar added to the reported loss) and adds its gradient
into an existing gradient buffer with ``add_gradient(w, grad)`` (in place, no temporaries beyond
one per call).
"""
from __future__ import annotations

from .backend import array_module
from .options import NonNegativeFloat
from .registry import regularizers


class Regularizer:
    """Base class: ``penalty(w)`` and ``add_gradient(w, grad)`` (and ``kink_distance(w)`` for
    gradcheck when the penalty has kinks)."""

    def penalty(self, w):
        raise NotImplementedError

    def add_gradient(self, w, grad) -> None:
        raise NotImplementedError

    def kink_distance(self, w):
        """How far ``w`` is from a kink of the penalty, or None (smooth): see Layer.kink_distance."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(strength={self.strength})"


regularizers.base = Regularizer


@regularizers.register()
class L2(Regularizer):
    """R(w) = strength · Σ w²,  ∂R/∂w = 2 · strength · w.

    Args:
        strength: the coefficient λ (Keras convention: no ½ factor).
    """

    def __init__(self, strength: NonNegativeFloat = 1e-4):
        self.strength = strength

    def penalty(self, w):
        # in float64: float32 squares overflow from |w| ≈ 1.8e19 (weights 1e30 gave an inf loss)
        return self.strength * float(array_module(w).square(w, dtype="float64").sum())

    def add_gradient(self, w, grad) -> None:
        # grad += 2λw without a float64 up-cast: a Python float keeps the array's dtype
        grad += (2.0 * self.strength) * w


@regularizers.register()
class L1(Regularizer):
    """R(w) = strength · Σ |w|,  ∂R/∂w = strength · sign(w) (0 at w = 0).

    Args:
        strength: the coefficient λ.
    """

    def __init__(self, strength: NonNegativeFloat = 1e-4):
        self.strength = strength

    def penalty(self, w):
        return self.strength * float(abs(w).sum(dtype="float64"))

    def add_gradient(self, w, grad) -> None:
        grad += self.strength * array_module(w).sign(w)

    def kink_distance(self, w):
        return abs(w)  # |w| has its kink at 0
