"""Dropout: inverted dropout, seeded by the framework's generator."""
from __future__ import annotations

import numpy as np

from ..options import Fraction
from ..registry import layers
from .base import InputSpec, Layer


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
        if self.rng is None:  # a layer used outside a model: still reproducible
            self.rng = self.backend.rng(0)
        # drawn in float32 whatever x's dtype: the same seed gives the same mask in float32 and
        # float64 (gradcheck differentiates a float64 copy of a float32 model), and half the bits
        u = self.rng.random(x.shape, dtype=np.float32)
        mask = (u >= self.rate).astype(x.dtype)
        mask *= 1.0 / (1.0 - self.rate)
        self._mask = mask
        return x * mask

    def backward(self, dy):
        return dy if self._mask is None else dy * self._mask

    def __repr__(self) -> str:
        return f"Dropout(rate={self.rate})"
