"""Dropout: inverted dropout, seeded by the framework's generator."""
from __future__ import annotations

import numpy as np

from ..backend import Kernel
from ..registry.options import Fraction
from ..registry import layers
from .base import InputSpec, Layer

# the mask is scale where u ≥ rate, else 0, and y = x·mask: bit for bit the CPU's three passes
_DROPOUT = Kernel("float32 u, T x, float32 rate, T scale", "T mask, T y",
                  "mask = u >= rate ? scale : (T)0; y = x * mask;", "dlrun_dropout")


@layers.register()
class Dropout(Layer):
    """Training: y = x ⊙ m / (1 − rate), m_i ~ Bernoulli(1 − rate); evaluation: y = x.

    Inverted dropout: the kept activations are scaled up while training, so evaluation needs
    no rescaling and E[y] = x in both phases. The mask is drawn from ``self.rng``, the seeded
    generator the model gives each layer, so runs with the same seed drop the same units.
    Backward multiplies by the same scaled mask (identity in evaluation).

    Args:
        rate: probability of dropping each element, in [0, 1); 0 makes the layer the identity.

    Shape:
        any input (N, ...) -> output of the same shape.
    """

    has_phase = True
    stochastic = True
    input_spec = InputSpec(shape=("D", "C"), options={"rate": 0.5})

    def __init__(self, rate: Fraction = 0.5):
        self.rate = rate

    def forward(self, x, y=None):
        if not self.training or self.rate == 0:
            self._mask = None
            return x
        out, self._mask = drop(self, x, self.rate)
        return out

    def backward(self, dy):
        if self._mask is None:
            return dy
        return self.xp.multiply(dy, self._mask, out=self.buffer("dx", dy.shape, dy.dtype))

    def __repr__(self) -> str:
        return f"Dropout(rate={self.rate})"


def drop(layer: Layer, x, rate: float):
    """(x ⊙ m/(1 − rate), m/(1 − rate)) with m ~ Bernoulli(1 − rate) drawn from ``layer.rng``:
    inverted dropout for any layer that drops (Dropout, the attention weights of
    MultiHeadAttention). The mask is kept by the caller for backward: dx = dy ⊙ mask."""
    if layer.rng is None:  # a layer used outside a model: still reproducible
        layer.rng = layer.backend.rng(0)
    xp, shape = layer.xp, x.shape
    # drawn in float32 whatever x's dtype: the same seed gives the same mask in float32 and
    # float64 (gradcheck differentiates a float64 copy of a float32 model), and half the bits
    u = layer.rng.random(shape, dtype=np.float32, out=layer.buffer("dropout_u", shape, np.float32))
    mask = layer.output_array("dropout_mask", shape, x.dtype)  # kept for backward: 0 or 1/(1 − rate)
    scale = 1.0 / (1.0 - rate)
    fused = _DROPOUT.on(xp)
    if fused is not None:  # GPU: one launch for what the CPU does in three passes
        return fused(u, x, rate, x.dtype.type(scale), mask, layer.output_array("dropout_y", shape, x.dtype))[1], mask
    xp.greater_equal(u, rate, out=mask)  # the rate is compared in float32 (a Python float)
    mask *= scale
    return xp.multiply(x, mask, out=layer.buffer("dropout_y", shape, x.dtype)), mask
