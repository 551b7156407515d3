"""MultiplyByTwo: the first custom layer of the neon documentation ("Creating new layers")."""
from __future__ import annotations

from ..registry import layers
from .base import InputSpec, Layer


@layers.register()
class MultiplyByTwo(Layer):
    """y = 2x; ∂L/∂x = 2·∂L/∂y. Output shape = input shape.

    Unlike the neon original, which overwrites its input and error buffers in place, this
    returns new arrays: dlrun layers never modify their inputs.
    """

    input_spec = InputSpec(shape=("D", "C"))

    def forward(self, x, y=None):
        return 2 * x

    def backward(self, dy):
        return 2 * dy
