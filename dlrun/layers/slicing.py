"""Slice: a range of each sample along one axis."""
from __future__ import annotations

from ..errors import ShapeError
from ..registry import layers
from .base import InputSpec, Layer


@layers.register()
class Slice(Layer):
    """y = x[:, …, start:stop] along per-sample ``axis``; ∂L/∂x is ∂L/∂y in that range, 0 elsewhere.

    Lets a node of a graph read part of its input: the two halves of a pair fed to one shared
    encoder (a Siamese network), or some channels of an image.

    Args:
        start: the first index kept (negative: counted from the end).
        stop: one past the last index kept (negative: counted from the end; null: to the end).
        axis: the per-sample axis, the batch axis not counted (0: the features of (N, D) input,
            the channels of (N, C, H, W) input; -1: the last axis).

    Shape:
        input (N, …, d, …) -> output (N, …, len(range(d)[start:stop]), …).

    Example:
        ``{type: Slice, start: 0, stop: 4}`` keeps the first 4 features.
    """

    input_spec = InputSpec(shape=("C", "D"), options={"start": 1, "stop": 3})

    def __init__(self, start: int = 0, stop: int | None = None, axis: int = 0):
        self.start, self.stop, self.axis = start, stop, axis

    def build(self, input_shape):
        rank = len(input_shape)
        if not -rank <= self.axis < rank:
            raise ShapeError(f"Slice(axis={self.axis}) needs an input with that axis, got shape {tuple(input_shape)}")
        a = self.axis % rank
        kept = range(input_shape[a])[self.start:self.stop]
        if not len(kept):
            raise ShapeError(f"Slice(start={self.start}, stop={self.stop}) keeps nothing of axis {self.axis} "
                             f"(size {input_shape[a]}) of input shape {tuple(input_shape)}")
        self._index = (slice(None),) * (a + 1) + (slice(kept.start, kept.stop),)
        return tuple(input_shape[:a]) + (len(kept),) + tuple(input_shape[a + 1:])

    def forward(self, x, y=None):
        self._xshape = x.shape
        return x[self._index]

    def backward(self, dy):
        dx = self.output_array("dx", self._xshape, dy.dtype)
        dx[...] = 0
        dx[self._index] = dy
        return dx

    def __repr__(self) -> str:
        return f"Slice(start={self.start}, stop={self.stop}, axis={self.axis})"
