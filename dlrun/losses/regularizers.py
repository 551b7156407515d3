"""Weight penalties added to the loss: attach per layer (``weight_regularizer``) or run-wide.

A regularizer gives ``penalty(w)`` (a scalar added to the reported loss) and adds its gradient
into an existing gradient buffer with ``add_gradient(w, grad)``, in place: the built-ins compute
into one reused scratch array on the CPU and run one fused kernel on the GPU, so a training step
allocates nothing for them.
"""
from __future__ import annotations

import numpy as np

from ..backend import Kernel, array_module
from ..registry.options import NonNegativeFloat
from ..registry import regularizers


class Regularizer:
    """Base class: ``penalty(w)`` and ``add_gradient(w, grad)`` (and ``kink_distance(w)`` for
    gradcheck when the penalty has kinks)."""

    def penalty(self, w):
        """R(w), a scalar: a Python float, or a 0-d array on w's device (the built-ins' kind; on
        the GPU it is then read back with the epoch's other values, not on its own)."""
        raise NotImplementedError

    def add_gradient(self, w, grad) -> None:
        raise NotImplementedError

    def kink_distance(self, w):
        """How far ``w`` is from a kink of the penalty, or None (smooth): see Layer.kink_distance."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(strength={self.strength})"

    def scratch(self, w):
        """A host array shaped like ``w`` to compute into: a view of one flat buffer as large as
        the largest tensor seen, shared by every tensor this regularizer serves (one per step
        each would be a fresh allocation, page faults included, per tensor per step)."""
        buf = self.__dict__.get("_scratch")
        if buf is None or buf.size < w.size or buf.dtype != w.dtype:
            buf = self._scratch = np.empty(w.size, w.dtype)
        return buf[:w.size].reshape(w.shape)


regularizers.base = Regularizer


# GPU: grad += c·w and grad += c·sign(w) in one launch each (sign(NaN) stays NaN, as numpy's)
_L2_GRAD = Kernel("T w, T c", "T grad", "grad += c * w;", "dlrun_l2_grad")
_L1_GRAD = Kernel("T w, T c", "T grad", "grad += w > (T)0 ? c : (w < (T)0 ? -c : w * (T)0);", "dlrun_l1_grad")


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
        # a scalar on w's device: the trainer reads it back with the epoch's other values
        return self.strength * array_module(w).square(w, dtype="float64").sum()

    def add_gradient(self, w, grad) -> None:
        # grad += 2λw without a float64 up-cast: a Python float keeps the array's dtype
        xp = array_module(w)
        fused = _L2_GRAD.on(xp)
        if fused is not None:
            fused(w, 2.0 * self.strength, grad)
            return
        grad += xp.multiply(w, 2.0 * self.strength, out=self.scratch(w))


@regularizers.register()
class L1(Regularizer):
    """R(w) = strength · Σ |w|,  ∂R/∂w = strength · sign(w) (0 at w = 0).

    Args:
        strength: the coefficient λ.
    """

    def __init__(self, strength: NonNegativeFloat = 1e-4):
        self.strength = strength

    def penalty(self, w):
        return self.strength * abs(w).sum(dtype="float64")

    def add_gradient(self, w, grad) -> None:
        xp = array_module(w)
        fused = _L1_GRAD.on(xp)
        if fused is not None:
            fused(w, self.strength, grad)
            return
        step = xp.sign(w, out=self.scratch(w))
        step *= self.strength  # a Python float keeps the array's dtype
        grad += step

    def kink_distance(self, w):
        return abs(w)  # |w| has its kink at 0
