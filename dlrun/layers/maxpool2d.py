"""MaxPool2D: the maximum over each pooling window of NCHW images."""
from __future__ import annotations

from ..registry import layers
from .base import InputSpec, Layer
from .windows import Size2, expect_image, make_window, pad_input, pair, unpad
from ..options import NonNegativeInt


@layers.register()
class MaxPool2D(Layer):
    """y[n,c,a,b] = max_{i,j} x̃[n, c, a·s_h + i, b·s_w + j]: the maximum of each pooling window.

    x̃ is x padded with -inf; ∂L/∂x goes to the one element of each window that gave the maximum.

    Computed as the running maximum of the kh·kw strided sub-grids of the input (one
    whole-array operation per window offset), never by reshaping into windows. Ties (equal
    values in a window, common after ReLU) send the gradient to exactly one element: the
    first in row-major window order, as in PyTorch. Non-overlapping pools (stride = pool_size,
    the default) write each input gradient once; overlapping pools (stride < pool_size) add
    the contributions of every window an element wins. Trailing rows/columns that do not
    fill a window are dropped (floor mode) and get zero gradient.

    Args:
        pool_size: window height and width: an integer or [ph, pw].
        stride: step between windows: an integer or [s_h, s_w]; default (null) = pool_size.
        padding: rows/columns of -inf added on each side: an integer or [p_h, p_w], at most
            half the pool size (so no window is all padding).

    Shape:
        input (N, C, H, W) -> output (N, C, Ho, Wo), Ho = floor((H + 2·p_h - ph) / s_h) + 1.

    Example:
        ``- {type: MaxPool2D, pool_size: 2}``
    """

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
        self.win = make_window("MaxPool2D", (h, w), self.pool_size, self.stride, (1, 1), self.padding)
        self.overlapping = any(s < k for s, k in zip(self.stride, self.pool_size))
        # windows that tile the padded input exactly write every gradient element: no zero fill
        self.tiling = (self.stride == self.pool_size
                       and all(o * k == n for o, k, n in zip(self.win.out_hw, self.pool_size, self.win.padded_hw)))
        return (c,) + self.win.out_hw

    def forward(self, x, y=None):
        xp = self.xp
        win = self.win
        fill = float("-inf") if x.dtype.kind == "f" else x.min()
        xpad = pad_input(xp, x, win, fill)
        grids = [xpad[(slice(None), slice(None)) + win.offset_slices(i, j)] for i, j in win.offsets()]
        out = grids[0].copy()
        for g in grids[1:]:
            xp.maximum(out, g, out=out)
        self._grids, self._out, self._masks = grids, out, None
        self._xshape = xpad.shape
        return out

    def _winner_masks(self):
        """One boolean mask per window offset, true where that offset holds its window's
        maximum and no earlier offset does (so ties go to exactly one element). Computed on
        demand: evaluation-mode forwards never pay for them."""
        if self._masks is None:
            xp = self.xp
            masks, taken = [], None
            for g in self._grids:
                m = g == self._out
                if taken is None:
                    taken = m.copy()
                else:
                    xp.greater(m, taken, out=m)  # m & ~taken, in one pass
                    taken |= m
                masks.append(m)
            self._masks = masks
        return self._masks

    def backward(self, dy):
        xp = self.xp
        win = self.win
        dxp = (xp.empty if self.tiling else xp.zeros)(self._xshape, dtype=dy.dtype)
        for (i, j), m in zip(win.offsets(), self._winner_masks()):
            idx = (slice(None), slice(None)) + win.offset_slices(i, j)
            if self.overlapping:
                dxp[idx] += dy * m
            else:  # disjoint windows: each input element is written by at most one offset
                xp.multiply(dy, m, out=dxp[idx])
        return unpad(dxp, win)

    def branch_signature(self):
        """The window offset (row-major index) that won each output: the argmax positions."""
        masks = self._winner_masks()
        arg = self.xp.zeros(masks[0].shape, dtype=self.xp.int32)
        for k, m in enumerate(masks[1:], start=1):
            arg += m * k
        return arg

    def __repr__(self) -> str:
        return f"MaxPool2D(pool_size={list(self.pool_size)}, stride={list(self.stride)}, padding={list(self.padding)})"

