"""Pool2D: the options, shape inference and repr that MaxPool2D and AvgPool2D share."""
from __future__ import annotations

from ..registry.options import NonNegativeInt
from .base import InputSpec, Layer
from .windows import Size2, expect_image, make_window, pair


class Pool2D(Layer):
    """Base of the 2-D pooling layers: a window of ``pool_size`` moved by ``stride`` over the
    padded NCHW input (floor mode). Subclasses implement ``forward`` and ``backward``."""

    input_spec = InputSpec(shape=("C", "H", "W"), options={"pool_size": 2, "stride": 1})

    def __init__(self, pool_size: Size2 = 2, stride: Size2 | None = None,
                 padding: NonNegativeInt | tuple[NonNegativeInt, NonNegativeInt] = 0):
        self.pool_size = pair(pool_size, "pool_size")
        self.stride = self.pool_size if stride is None else pair(stride, "stride")
        self.padding = pair(padding, "padding")
        if any(2 * p > k for p, k in zip(self.padding, self.pool_size)):
            raise ValueError(f"padding {list(self.padding)} must be at most half the pool size "
                             f"{list(self.pool_size)}")

    def build(self, input_shape):
        c, h, w = expect_image(self, input_shape)
        self.win = make_window(type(self).__name__, (h, w), self.pool_size, self.stride, (1, 1), self.padding)
        return (c,) + self.win.out_hw

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(pool_size={list(self.pool_size)}, stride={list(self.stride)}, "
                f"padding={list(self.padding)})")
