"""A layer's tensor and its gradient: what optimizers update and checkpoints save."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)  # identity, not an elementwise comparison of arrays
class Parameter:
    """A tensor of a layer with its gradient.

    Attributes:
        data: the values (numpy or cupy array, the model's dtype).
        grad: the gradient written by the layer's ``backward`` (same shape and dtype), or None
            for a constant.
        trainable: False for constants that training must never change.
        regularizer: the layer's own regularizer for this tensor, or None.
        regularize: whether the run-wide default regularizer applies (weights yes, biases no).
    """

    data: Any
    grad: Any = None
    trainable: bool = True
    regularizer: Any = None
    regularize: bool = True

    def __setattr__(self, name, value):
        # rebinding data or grad to another array (not writing into them, and not ``p.data -= g``,
        # which assigns the same array back) tells the arena holding this tensor, so its
        # per-step ``adopt`` is one flag test instead of a loop over every tensor
        if (name == "data" or name == "grad") and value is not self.__dict__.get(name):
            arena = self.__dict__.get("_arena")
            if arena is not None:
                arena.dirty = True
        object.__setattr__(self, name, value)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def size(self) -> int:
        return int(self.data.size)
