"""ReQU: the rectified quadratic unit of the Oxford machine-learning practical 5 (Torch)."""
from __future__ import annotations

from ..registry import layers
from .base import InputSpec, Layer


@layers.register()
class ReQU(Layer):
    """z = x² where x > 0, else 0; ∂z/∂x = 2x where x > 0, else 0.

    The derivative is continuous (0 on both sides of 0), so the function is C¹ and finite
    differences across 0 stay accurate: no branch signature is needed.
    """

    input_spec = InputSpec(shape=("D", "C"))

    def forward(self, x, y=None):
        self._xpos = x * self.xp.greater(x, 0)
        return self._xpos * self._xpos

    def backward(self, dy):
        return dy * (2 * self._xpos)
