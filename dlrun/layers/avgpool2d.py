"""AvgPool2D: the mean over each pooling window of NCHW images."""
from __future__ import annotations

from ..registry import layers
from .pool2d import Pool2D
from .windows import pad_input, unpad


@layers.register()
class AvgPool2D(Pool2D):
    """y[n,c,a,b] = (1/(ph·pw)) Σ_{i,j} x̃[n, c, a·s_h + i, b·s_w + j]: the mean of each window.

    x̃ is x zero-padded; ∂L/∂x̃ = dy / (ph·pw) spread over each window.

    The divisor is always ph·pw, padded zeros included (PyTorch's count_include_pad=True).
    Computed as the sum of the kh·kw strided sub-grids; the backward pass adds dy/(ph·pw) onto
    each sub-grid, so overlapping windows (stride < pool_size) accumulate correctly. Trailing
    rows/columns that do not fill a window are dropped (floor mode) and get zero gradient.

    Args:
        pool_size: window height and width: an integer or [ph, pw].
        stride: step between windows: an integer or [s_h, s_w]; default (null) = pool_size.
        padding: rows/columns of zeros added on each side: an integer or [p_h, p_w], at most
            half the pool size.

    Shape:
        input (N, C, H, W) -> output (N, C, Ho, Wo), Ho = floor((H + 2·p_h - ph) / s_h) + 1.
    """

    def forward(self, x, y=None):
        win = self.win
        xpad = pad_input(self.xp, x, win, buffers=self.buffers)
        self._xshape = xpad.shape
        offsets = win.offsets()
        out = xpad[(slice(None), slice(None)) + win.offset_slices(*offsets[0])].copy()
        for i, j in offsets[1:]:
            out += xpad[(slice(None), slice(None)) + win.offset_slices(i, j)]
        out *= 1.0 / len(offsets)  # a Python float keeps the array's dtype
        return out

    def backward(self, dy):
        win = self.win
        offsets = win.offsets()
        g = (1.0 / len(offsets)) * dy
        dxp = self.xp.zeros(self._xshape, dtype=dy.dtype)
        for i, j in offsets:
            dxp[(slice(None), slice(None)) + win.offset_slices(i, j)] += g
        return unpad(dxp, win)
