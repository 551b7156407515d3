"""Flatten: each sample's features as one vector."""
from __future__ import annotations

import math

from ..registry import layers
from .base import InputSpec, Layer


@layers.register()
class Flatten(Layer):
    """y[n] = x[n].ravel() (row-major, C·H·W order for images); ∂L/∂x = dy reshaped back.

    A view on contiguous input (no copy). Put it between convolution/pooling layers and Linear.

    Shape:
        input (N, d1, d2, ...) -> output (N, d1·d2·...).
    """

    input_spec = InputSpec(shape=("C", "H", "W"))

    def build(self, input_shape):
        return (math.prod(input_shape),)

    def forward(self, x, y=None):
        self._xshape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        return dy.reshape(self._xshape)
