"""SequencePool: one vector per sequence, the mean of its steps or one chosen step."""
from __future__ import annotations

from typing import Literal

from ..registry import layers
from .base import InputSpec, Layer
from ..errors import ShapeError


@layers.register()
class SequencePool(Layer):
    """y[n] = (1/T) Σ_t x[n, t] (mode mean), x[n, 0] (first) or x[n, T − 1] (last).

    Reduces a sequence (N, T, E) to one vector per sample, (N, E) (in general (N, T, *F) to
    (N, *F)), for a classifier after attention or a recurrent layer with ``return_sequences``.
    ``mean`` pools every step (Keras' ``GlobalAveragePooling1D``); ``first`` keeps the first
    step, as BERT classifies from its first ([CLS]) token; ``last`` keeps the last step (after
    a causal model, the only step that has seen the whole sequence).

    ∂L/∂x[n, t] = dy[n]/T (mean); dy[n] at the kept step and 0 elsewhere (first, last).

    Args:
        mode: "mean" (default), "first" or "last".

    Shape:
        input (N, T, *F) -> output (N, *F): the step axis (axis 1) is removed.
    """

    input_spec = InputSpec(shape=("T", "D"))

    def __init__(self, mode: Literal["mean", "first", "last"] = "mean"):
        self.mode = mode

    def build(self, input_shape):
        if len(input_shape) < 2:
            raise ShapeError(f"SequencePool expects (N, T, features) input, a sequence per sample, got input of "
                             f"shape {tuple(input_shape)} per sample")
        self._steps = int(input_shape[0])
        self._at = {"first": 0, "last": self._steps - 1}.get(self.mode)
        return tuple(input_shape[1:])

    def forward(self, x, y=None):
        self._xshape = x.shape
        if self._at is None:
            return x.mean(axis=1)
        return x[:, self._at].copy()

    def backward(self, dy):
        if not self.needs_input_grad:
            return None
        xp = self.xp
        if self._at is None:
            dx = xp.empty(self._xshape, dy.dtype)
            dx[...] = xp.multiply(dy, dy.dtype.type(1.0 / self._steps))[:, None]
            return dx
        dx = xp.zeros(self._xshape, dy.dtype)
        dx[:, self._at] = dy
        return dx
