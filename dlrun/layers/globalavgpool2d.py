"""GlobalAvgPool2D: one mean per channel over the whole image."""
from __future__ import annotations

from ..registry import layers
from .base import InputSpec, Layer
from .windows import expect_image


@layers.register()
class GlobalAvgPool2D(Layer):
    """y[n,c] = (1/(H·W)) Σ_{h,w} x[n,c,h,w];  ∂L/∂x[n,c,h,w] = dy[n,c] / (H·W).

    Replaces Flatten before the classifier of a convolutional net, whatever the image size.

    Shape:
        input (N, C, H, W) -> output (N, C).
    """

    input_spec = InputSpec(shape=("C", "H", "W"))

    def build(self, input_shape):
        c, h, w = expect_image(self, input_shape)
        self._hw = (h, w)
        return (c,)

    def forward(self, x, y=None):
        self._xshape = x.shape
        return x.mean(axis=(2, 3))

    def backward(self, dy):
        h, w = self._hw
        dx = self.xp.empty(self._xshape, dtype=dy.dtype)
        dx[...] = ((1.0 / (h * w)) * dy)[:, :, None, None]
        return dx
