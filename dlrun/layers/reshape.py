"""Reshape: give each sample a new shape with the same number of elements."""
from __future__ import annotations

import math

from ..errors import ShapeError
from ..registry import layers
from .base import InputSpec, Layer


@layers.register()
class Reshape(Layer):
    """y[n] = x[n].reshape(target_shape) (row-major); ∂L/∂x = dy reshaped back.

    Args:
        target_shape: the per-sample output shape (no batch axis), a list of positive
            integers; one entry may be -1, meaning "whatever makes the sizes match".

    Shape:
        input (N, *s) -> output (N, *target_shape), with prod(s) = prod(target_shape).

    Example:
        ``- {type: Reshape, target_shape: [1, 8, 8]}`` turns 64 features into a 1×8×8 image.
    """

    input_spec = InputSpec(shape=("D", "C"), options={"target_shape": [-1]})

    def __init__(self, target_shape: list[int]):
        shape = [int(s) for s in target_shape]
        if not shape:
            raise ValueError("target_shape must have at least one entry")
        if shape.count(-1) > 1:
            raise ValueError(f"target_shape may contain one -1, got {shape}")
        if any(s == 0 or s < -1 for s in shape):
            raise ValueError(f"target_shape entries must be positive or -1, got {shape}")
        self.target_shape = shape

    def build(self, input_shape):
        size = math.prod(input_shape)
        known = math.prod(s for s in self.target_shape if s != -1)
        if -1 in self.target_shape:
            if size % known:
                raise ShapeError(f"cannot reshape {tuple(input_shape)} ({size} values) to "
                                 f"{self.target_shape}: {size} is not a multiple of {known}")
            out = tuple(size // known if s == -1 else s for s in self.target_shape)
        else:
            out = tuple(self.target_shape)
            if known != size:
                raise ShapeError(f"cannot reshape {tuple(input_shape)} ({size} values) to "
                                 f"{self.target_shape} ({known} values)")
        self.output_shape = out
        return out

    def forward(self, x, y=None):
        self._xshape = x.shape
        return x.reshape((x.shape[0],) + self.output_shape)

    def backward(self, dy):
        return dy.reshape(self._xshape)

    def __repr__(self) -> str:
        return f"Reshape(target_shape={self.target_shape})"
