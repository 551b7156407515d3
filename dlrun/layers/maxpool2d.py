"""MaxPool2D: the maximum over each pooling window of NCHW images."""
from __future__ import annotations

import math

import numpy as np

from ..backend import Kernel
from ..registry import layers
from .minmax import runner_up_gap
from .pool2d import Pool2D
from .windows import pad_input, unpad

# GPU kernels for non-overlapping unpadded windows (see MaxPool2D._forward_gpu).
_GEOMETRY = "int32 H, int32 W, int32 Ho, int32 Wo, int32 kh, int32 kw"
_POOL = Kernel("raw T x, " + _GEOMETRY, "T y, int32 arg", """
    long long b = i % Wo, a = (i / Wo) % Ho, nc = i / ((long long)Wo * Ho);
    long long r0 = nc * H * W + a * kh * W + b * kw;
    T best = x[r0]; int win = 0; bool nan = false;
    for (int p = 0; p < kh; ++p) for (int q = 0; q < kw; ++q) {
        T v = x[r0 + p * W + q];
        if (v != v) { nan = true; best = v; win = p * kw + q; }
        else if (!nan && v > best) { best = v; win = p * kw + q; }
    }
    y = best; arg = win;""", "dlrun_maxpool")
_POOL_GRAD = Kernel("raw T dy, raw int32 arg, " + _GEOMETRY, "T dx", """
    long long c = i % W, r = (i / W) % H, nc = i / ((long long)W * H);
    long long a = r / kh, b = c / kw;
    T g = 0;
    if (a < Ho && b < Wo) {
        long long o = (nc * Ho + a) * Wo + b;
        if (arg[o] == (r - a * kh) * kw + (c - b * kw)) g = dy[o];
    }
    dx = g;""", "dlrun_maxpool_grad")
# Overlapping or padded pools on GPU: run over the window offsets in reverse order, this marks
# the last NaN of each window that has no winner yet (``pending``: its maximum is NaN).
_NAN_WINNER = Kernel("T g", "bool m, bool pending", """
    if (pending && g != g) { m = true; pending = false; }""", "dlrun_maxpool_nan")


@layers.register()
class MaxPool2D(Pool2D):
    """y[n,c,a,b] = max_{i,j} x̃[n, c, a·s_h + i, b·s_w + j]: the maximum of each pooling window.

    x̃ is x padded with -inf; ∂L/∂x goes to the one element of each window that gave the maximum.
    A window holding a NaN has the maximum NaN, and its gradient goes to its NaN (the last one
    in row-major window order when it holds several), as in PyTorch.

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

    def build(self, input_shape):
        out = super().build(input_shape)
        self.overlapping = any(s < k for s, k in zip(self.stride, self.pool_size))
        self.disjoint = self.stride == self.pool_size and not self.win.has_padding
        # windows that tile the padded input exactly write every gradient element: no zero fill
        self.tiling = (self.stride == self.pool_size
                       and all(o * k == n for o, k, n in zip(self.win.out_hw, self.pool_size, self.win.padded_hw)))
        return out

    def forward(self, x, y=None):
        xp = self.xp
        win = self.win
        self._arg = None
        if self.disjoint and x.dtype.kind == "f" and _POOL.on(xp) is not None:
            return self._forward_gpu(xp, x)
        if self.training and self.disjoint:
            grids = self._split_windows(xp, x)
        else:
            if x.dtype.kind == "f":  # the -inf border of a reused padded copy is written once
                xpad = pad_input(xp, x, win, float("-inf"), self.buffers)
            else:
                xpad = pad_input(xp, x, win, x.min())
            grids = [xpad[(slice(None), slice(None)) + win.offset_slices(i, j)] for i, j in win.offsets()]
        out = self.buffer("y", grids[0].shape, x.dtype)  # reused in fast mode: no page faults
        if len(grids) == 1:  # a 1x1 pool
            out = grids[0].copy()
        else:
            out = xp.maximum(grids[0], grids[1], out=out)  # the first pass writes out: no copy
        for g in grids[2:]:
            xp.maximum(out, g, out=out)
        self._grids, self._out, self._masks = grids, out, None
        self._xshape = x.shape[:2] + win.padded_hw
        return out

    def _split_windows(self, xp, x):
        """The kh·kw sub-grids of disjoint unpadded windows, copied into one (kh·kw, N, C, Ho, Wo)
        array: one strided pass over x, after which the forward maxima and backward's winner
        masks all run on contiguous arrays. Training only, where backward reads the grids a
        second time: 811 -> 626 µs for forward plus backward on 64×8×26×26 float32; evaluation
        reads them once and keeps the strided views."""
        (kh, kw), (ho, wo) = self.pool_size, self.win.out_hw
        n, c = x.shape[:2]
        split = self.output_array("windows", (kh * kw, n, c, ho, wo), x.dtype)
        split.reshape(kh, kw, n, c, ho, wo)[...] = \
            x[:, :, :ho * kh, :wo * kw].reshape(n, c, ho, kh, wo, kw).transpose(3, 5, 0, 1, 2, 4)
        return list(split)

    # GPU, non-overlapping unpadded windows (the usual pool): one kernel each way instead of a
    # launch per window offset. Forward records the winning offset of each window (first in
    # row-major order on ties, the last NaN when the window holds any, as the CPU masks); backward
    # is a gather over input elements, so every dx element is written once and needs no zero fill.
    def _forward_gpu(self, xp, x):
        x = xp.ascontiguousarray(x)
        (kh, kw), (h, w), (ho, wo) = self.pool_size, x.shape[2:], self.win.out_hw
        kernel = _POOL.on(xp)
        shape = x.shape[:2] + (ho, wo)
        # outputs always passed: the other arrays are raw and cannot give the kernel its size
        out, self._arg = kernel(x, h, w, ho, wo, kh, kw, self.output_array("y", shape, x.dtype),
                                self.output_array("arg", shape, np.int32))
        self._xshape = x.shape
        return out

    def _backward_gpu(self, xp, dy):
        (kh, kw), (h, w), (ho, wo) = self.pool_size, self._xshape[2:], self.win.out_hw
        dx = self.output_array("dx", self._xshape, dy.dtype)
        return _POOL_GRAD.on(xp)(xp.ascontiguousarray(dy), self._arg, h, w, ho, wo, kh, kw, dx)

    def _winner_masks(self):
        """One boolean mask per window offset, true where that offset holds its window's
        maximum and no earlier offset does (so ties go to exactly one element). A window whose
        maximum is NaN equals none of its values; its mask goes to its last NaN instead.
        Computed on demand: evaluation-mode forwards never pay for them."""
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
            if self._out.dtype.kind == "f":
                self._mark_nan_winners(xp, masks, taken)
            self._masks = masks
        return self._masks

    def _mark_nan_winners(self, xp, masks, taken):
        """Give each window without a winner (its maximum is NaN) to its last NaN, as PyTorch
        does. Over the offsets in reverse order, the first NaN met in such a window takes it.
        numpy looks for such windows first (one pass over ``taken``), so inputs without NaN pay
        nothing more; CuPy runs one kernel per offset instead, as reading the answer on the
        host would wait for the device."""
        kernel = _NAN_WINNER.on(xp)
        if kernel is None and taken.all():
            return
        pending = ~taken
        for g, m in zip(reversed(self._grids), reversed(masks)):
            if kernel is not None:
                kernel(g, m, pending)
            else:
                hit = xp.isnan(g)
                hit &= pending
                m |= hit
                pending ^= hit  # hit lies within pending: this clears it

    def backward(self, dy):
        xp = self.xp
        if self._arg is not None:
            return self._backward_gpu(xp, dy)
        win = self.win
        dxp = self.buffer("dx", self._xshape, dy.dtype)  # reused in fast mode
        if dxp is None:
            dxp = (xp.empty if self.tiling else xp.zeros)(self._xshape, dtype=dy.dtype)
        elif not self.tiling:  # some elements are in no window, or several windows add up
            dxp.fill(0)
        for (i, j), m in zip(win.offsets(), self._winner_masks()):
            idx = (slice(None), slice(None)) + win.offset_slices(i, j)
            if self.overlapping:
                dxp[idx] += dy * m
            else:  # disjoint windows: each input element is written by at most one offset
                xp.multiply(dy, m, out=dxp[idx])
        return unpad(dxp, win)

    def kink_distance(self, x, y=None):
        """The gap between each window's two largest values, over √2 (None for a 1×1 pool)."""
        win = self.win
        if len(list(win.offsets())) < 2:
            return None
        xpad = pad_input(self.xp, x, win, float("-inf"))
        grids = self.xp.stack([xpad[(slice(None), slice(None)) + win.offset_slices(i, j)] for i, j in win.offsets()])
        return runner_up_gap(grids) / math.sqrt(2)

    def branch_signature(self):
        """The window offset (row-major index) that won each output: the argmax positions."""
        if self._arg is not None:
            return self._arg
        masks = self._winner_masks()
        arg = self.xp.zeros(masks[0].shape, dtype=self.xp.int32)
        for k, m in enumerate(masks[1:], start=1):
            arg += m * k
        return arg
