"""Conv2D: 2-D convolution (cross-correlation) on NCHW images, by im2col and batched GEMM."""
from __future__ import annotations

from .initializers import Initializer
from ..registry.options import PositiveInt
from ..losses.regularizers import Regularizer
from .base import InputSpec, Layer
from .linear import _init
from ..registry import layers
from .windows import (Padding2, Size2, col2im, col2im_channels_last, expect_image, im2col, im2col_channels_last,
                      make_window, pad_channels_last, pad_input, pair, unpad)


ONE_GEMM_MAX_PIXELS = 64  # up to this many output pixels (Ho·Wo), one GEMM beats a batched one
LAYOUTS = ("batched", "one_gemm", "channels_last")


@layers.register()
class Conv2D(Layer):
    """y[n,o] = b[o] + Σ_c W[o,c] ⋆ x̃[n,c]: 2-D cross-correlation of padded NCHW images.

    In full: y[n,o,a,b] = b[o] + Σ_{c,i,j} W[o,c,i,j] · x̃[n, c, a·s_h + i·d_h, b·s_w + j·d_w],
    with x̃ the zero-padded input, s the stride and d the dilation. A cross-correlation (no kernel flip, as in every deep-learning library) over channels-first
    images. Computed as im2col (one strided view and one copy) followed by the batched GEMM
    ``W(O, C·kh·kw) @ cols(N, C·kh·kw, Ho·Wo)``, so the output comes out NCHW without a transpose;
    the weight gradient is a batched matmul summed over the batch and the input gradient is
    col2im (kh·kw strided slab adds). The bias rides in the GEMMs: the columns carry a row of
    ones and W a column b, so forward adds b and the weight-gradient GEMM yields db. With at most 64 output pixels per sample each product is
    one GEMM over all samples instead: on channels-last columns (N·Ho·Wo, kh·kw·C) when there
    are at least as many channels as output columns, else on (C·kh·kw, N·Ho·Wo) columns
    (:func:`choose_layout`).

    Args:
        filters: number of output channels O.
        kernel_size: kernel height and width: an integer or [kh, kw].
        stride: step between windows: an integer or [s_h, s_w].
        padding: zero padding: an integer or [p_h, p_w] added on both sides, "valid" (none) or
            "same" (output size ceil(input / stride), as in Keras; any odd extra row or column
            goes to the bottom/right).
        dilation: spacing between kernel taps: an integer or [d_h, d_w] (1 = a dense kernel).
        use_bias: add the per-filter bias b.
        weight_initializer: initializer for W (fan_in = C·kh·kw, fan_out = O·kh·kw).
        bias_initializer: initializer for b.
        weight_regularizer: penalty on W (overrides the run-wide regularizer).
        bias_regularizer: penalty on b (biases are otherwise not regularized).

    Shape:
        input (N, C, H, W) -> output (N, O, Ho, Wo) with
        Ho = floor((H + p_top + p_bottom - d_h·(kh-1) - 1) / s_h) + 1 (Wo likewise).
        W has shape (O, C, kh, kw), b has shape (O,).

    Example:
        ``- {type: Conv2D, filters: 16, kernel_size: 3, padding: same}``
    """

    input_spec = InputSpec(shape=("C", "H", "W"), options={"filters": 3, "kernel_size": 3, "padding": 1})

    def __init__(self, filters: PositiveInt, kernel_size: Size2 = 3, stride: Size2 = 1,
                 padding: Padding2 = 0, dilation: Size2 = 1, use_bias: bool = True,
                 weight_initializer: Initializer = "he_uniform",
                 bias_initializer: Initializer = "zeros",
                 weight_regularizer: Regularizer | None = None,
                 bias_regularizer: Regularizer | None = None):
        self.filters = filters
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.stride = pair(stride, "stride")
        self.dilation = pair(dilation, "dilation")
        self.padding = padding if isinstance(padding, str) else pair(padding, "padding")
        self.use_bias = use_bias
        self.weight_initializer = _init(weight_initializer)
        self.bias_initializer = _init(bias_initializer)
        self.weight_regularizer = weight_regularizer
        self.bias_regularizer = bias_regularizer

    def build(self, input_shape):
        c, h, w = expect_image(self, input_shape)
        self.win = make_window("Conv2D", (h, w), self.kernel_size, self.stride, self.dilation, self.padding)
        kh, kw = self.kernel_size
        o = self.filters
        self.weight = self.add_param("weight", (o, c, kh, kw), self.weight_initializer,
                                     fan_in=c * kh * kw, fan_out=o * kh * kw,
                                     regularizer=self.weight_regularizer)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_param("bias", (o,), self.bias_initializer, fan_in=c * kh * kw,
                                       fan_out=o * kh * kw, regularizer=self.bias_regularizer,
                                       regularize=False)
        self.channels = c
        self.layout = choose_layout(c, self.win.out_hw, cpu=self.xp.__name__ == "numpy")
        return (o,) + self.win.out_hw

    @property
    def one_gemm(self) -> bool:
        return self.layout == "one_gemm"

    def forward(self, x, y=None):
        if self.layout == "channels_last":
            return self._forward_channels_last(x)
        xp = self.xp
        n = x.shape[0]
        o = self.filters
        k, p = self.weight.data[0].size, self.win.out_hw[0] * self.win.out_hw[1]
        # with a bias the columns get a row of ones and W a column b: the GEMM adds the bias (no
        # pass over the output) and backward's weight-gradient GEMM yields db (no reduction)
        kb = k + (self.bias is not None)
        shape = (kb, n * p) if self.one_gemm else (n, kb, p)  # (K+1, N·P) or (N, K+1, P)
        # in fast mode the columns and the output are reused buffers: at MB sizes a fresh
        # array costs its page faults every step; the ones row is written once per buffer
        cols = self.buffers.group(("cols_with_ones", shape, x.dtype), lambda: _columns_with_ones(xp, shape, k, x.dtype))
        # cols[:, :k] is not contiguous, but its (K, P) blocks are: splitting K and P (in _columns)
        # is a view in numpy and CuPy alike, so im2col writes into the buffer itself
        im2col(xp, pad_input(xp, x, self.win, buffers=self.buffers), self.win, self.one_gemm, cols[:k] if self.one_gemm else cols[:, :k])
        self._cols = cols
        wb = self.weight.data.reshape(o, k)
        if self.bias is not None:
            wb = self.output_array("wb", (o, kb), x.dtype)
            wb[:, :k] = self.weight.data.reshape(o, k)
            wb[:, k] = self.bias.data
        # (N, O, P): already NCHW order; or (O, N·P)
        out = self.backend.matmul(wb, cols, out=self.buffer("gemm" if self.one_gemm else "y",
                                                  (o, n * p) if self.one_gemm else (n, o, p), x.dtype))
        if self.one_gemm:
            y = self.output_array("y", (n, o, p), x.dtype)
            y[...] = out.reshape(o, n, p).transpose(1, 0, 2)
            out = y
        return out.reshape((n, o) + self.win.out_hw)

    def backward(self, dy):
        if self.layout == "channels_last":
            return self._backward_channels_last(dy)
        xp = self.xp
        n, o = dy.shape[:2]
        cols = self._cols
        k = self.weight.data[0].size
        # the gradient of [W | b]: the bias column comes from the ones row of the columns
        gb = self.weight.grad.reshape(o, k) if self.bias is None else self.output_array("gwb", (o, k + 1), dy.dtype)
        if self.one_gemm:
            d = xp.ascontiguousarray(dy.reshape(n, o, -1).transpose(1, 0, 2)).reshape(o, -1)  # (O, N·P)
            self.backend.matmul(d, cols.T, out=gb)
        else:
            d = dy.reshape(n, o, -1)  # (N, O, P)
            # batched matmul then a sum over the batch: 3-5x faster than tensordot/einsum here
            self.backend.matmul(d, cols.transpose(0, 2, 1)).sum(axis=0, out=gb)
        if self.bias is not None:
            self.weight.grad.reshape(o, k)[...] = gb[:, :k]
            self.bias.grad[...] = gb[:, k]
        if not self.needs_input_grad:  # first layer of a training loop: skip the matmul and col2im
            return None
        dcols = self.backend.matmul(self.weight.data.reshape(o, k).T, d)  # (N, K, P) or (K, N·P)
        return unpad(col2im(xp, dcols, self.win, self.channels, n if self.one_gemm else None), self.win)

    # channels-last: columns (N·Ho·Wo, kh·kw·C) copied with C-long contiguous runs, one GEMM
    # against W as (kh·kw·C, O), and transposes of the (small) input, output and dy
    def _forward_channels_last(self, x):
        xp, win, n, o, c = self.xp, self.win, x.shape[0], self.filters, self.channels
        (ho, wo), (kh, kw) = win.out_hw, self.kernel_size
        k, p = kh * kw * c, ho * wo
        # the padded copy keeps its zero border between calls: only the interior is rewritten
        xpad = pad_channels_last(xp, x, win, self.buffers.group(
            ("xpad_cl", x.shape, x.dtype), lambda: xp.zeros((n,) + win.padded_hw + (c,), x.dtype)))
        self._cols = im2col_channels_last(xp, xpad, win, self.buffer("cols", (n * p, k), x.dtype))
        self._w2 = self.weight.data.transpose(2, 3, 1, 0).reshape(k, o)  # a copy of W, (kh·kw·C, O)
        out = self.backend.matmul(self._cols, self._w2, out=self.buffer("gemm", (n * p, o), x.dtype))
        if self.bias is not None:
            out += self.bias.data
        y = self.output_array("y", (n, o, ho, wo), x.dtype)
        y[...] = out.reshape(n, ho, wo, o).transpose(0, 3, 1, 2)
        return y

    def _backward_channels_last(self, dy):
        xp, win, n, o, c = self.xp, self.win, dy.shape[0], self.filters, self.channels
        (ho, wo), (kh, kw) = win.out_hw, self.kernel_size
        d = self.output_array("d", (n * ho * wo, o), dy.dtype)
        d.reshape(n, ho, wo, o)[...] = dy.transpose(0, 2, 3, 1)
        self.weight.grad[...] = self.backend.matmul(self._cols.T, d).reshape(kh, kw, c, o).transpose(3, 2, 0, 1)
        if self.bias is not None:
            self.backend.matmul(self.buffers.ones(xp, d.shape[0], dy.dtype), d, out=self.bias.grad)
        if not self.needs_input_grad:
            return None
        dxp = col2im_channels_last(xp, self.backend.matmul(d, self._w2.T), win, c, n)
        (t, _, l, _), (h, w) = win.pad, win.in_hw
        dx = self.output_array("dx", (n, c, h, w), dy.dtype)
        dx[...] = dxp[:, t:t + h, l:l + w, :].transpose(0, 3, 1, 2)
        return dx

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None)
        if spec:
            return super().__repr__()
        return (f"Conv2D(filters={self.filters}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding!r}, dilation={self.dilation})")


def _columns_with_ones(xp, shape, k: int, dtype):
    """Columns of ``shape`` (K+1, N·P) or (N, K+1, P) whose rows from ``k`` on (the bias row,
    if any) are ones; im2col fills the first k rows."""
    cols = xp.empty(shape, dtype=dtype)
    if len(shape) == 2:
        cols[k:] = 1
    else:
        cols[:, k:] = 1
    return cols


def choose_layout(channels: int, out_hw, cpu: bool = True) -> str:
    """How Conv2D lays out its columns for C input channels and Ho x Wo outputs.

    Up to 64 output pixels per sample, N small GEMMs are slow (2x on 4x4 outputs), so all samples
    go side by side into one GEMM: channels-last when there are at least as many channels as
    output columns (the im2col copy then runs over C contiguous floats instead of Wo; 7x faster
    on the digits CNN's 32-channel 4x4 layer), else (C·kh·kw, N·Ho·Wo) columns. Larger outputs
    use the batched per-sample GEMM, whose output is already NCHW. Channels-last is chosen on
    the CPU only: it has not yet been run on a CUDA device (it is plain CuPy array code)."""
    ho, wo = out_hw
    if ho * wo > ONE_GEMM_MAX_PIXELS:
        return "batched"
    return "channels_last" if cpu and channels >= wo else "one_gemm"
