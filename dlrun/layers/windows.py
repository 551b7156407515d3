"""Sliding-window geometry shared by Conv2D and the pooling layers (NCHW).

A 2-D window layer reads, for every output pixel (a, b), the input pixels
``(a·stride + i·dilation, b·stride + j·dilation)`` of the padded input, for kernel offsets
(i, j). Everything here works on numpy and cupy alike: views come from
``xp.lib.stride_tricks.as_strided`` and whole-array slicing, never from Python loops over
samples, pixels or channels (only over the kh·kw kernel offsets).
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Literal

from ..errors import ShapeError
from ..registry.options import NonNegativeInt, PositiveInt

# option types shared by the window layers (YAML: ``3`` or ``[3, 2]``; padding also "same"/"valid")
Size2 = PositiveInt | tuple[PositiveInt, PositiveInt]
Padding2 = NonNegativeInt | tuple[NonNegativeInt, NonNegativeInt] | Literal["valid", "same"]


def pair(value, name: str) -> tuple[int, int]:
    """``3`` -> (3, 3); ``[3, 2]`` -> (3, 2); raise ValueError for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"{name} must be an integer or a list of two integers, got {value!r}")


@dataclass(frozen=True)
class Window:
    """Geometry of one 2-D window layer for one input size.

    Attributes:
        kernel, stride, dilation: (rows, cols) pairs.
        pad: (top, bottom, left, right) zero (or -inf) padding.
        in_hw: unpadded input (H, W); out_hw: output (Ho, Wo).
    """

    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad: tuple[int, int, int, int]
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]

    @property
    def padded_hw(self) -> tuple[int, int]:
        t, b, l, r = self.pad
        return (self.in_hw[0] + t + b, self.in_hw[1] + l + r)

    @property
    def has_padding(self) -> bool:
        return any(self.pad)

    def offset_slices(self, i: int, j: int) -> tuple[slice, slice]:
        """Slices of the padded input read by kernel offset (i, j) for all outputs: a
        strided sub-grid of shape (Ho, Wo)."""
        (ho, wo), (sh, sw), (dh, dw) = self.out_hw, self.stride, self.dilation
        r0, c0 = i * dh, j * dw
        return (slice(r0, r0 + sh * (ho - 1) + 1, sh), slice(c0, c0 + sw * (wo - 1) + 1, sw))

    def offsets(self):
        """All kernel offsets (i, j) in row-major order."""
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]


def make_window(layer: str, in_hw, kernel, stride, dilation, padding) -> Window:
    """Resolve ``padding`` (int, pair, "valid" or "same") and the output size; ShapeError
    names the layer when the window does not fit the input."""
    h, w = int(in_hw[0]), int(in_hw[1])
    eff = (dilation[0] * (kernel[0] - 1) + 1, dilation[1] * (kernel[1] - 1) + 1)
    if padding == "valid":
        pad = (0, 0, 0, 0)
    elif padding == "same":  # Keras/TensorFlow rule: out = ceil(in / stride), extra pad at the end
        pads = []
        for n, s, k in ((h, stride[0], eff[0]), (w, stride[1], eff[1])):
            total = max((-(-n // s) - 1) * s + k - n, 0)
            pads += [total // 2, total - total // 2]
        pad = tuple(pads)
    else:
        ph, pw = pair(padding, "padding")
        pad = (ph, ph, pw, pw)
    hp, wp = h + pad[0] + pad[1], w + pad[2] + pad[3]
    ho, wo = (hp - eff[0]) // stride[0] + 1, (wp - eff[1]) // stride[1] + 1
    if hp < eff[0] or wp < eff[1]:
        raise ShapeError(
            f"{layer}: a window of {eff[0]}x{eff[1]} pixels (kernel {kernel[0]}x{kernel[1]}, dilation "
            f"{dilation[0]}x{dilation[1]}) does not fit the {hp}x{wp} padded input (input {h}x{w}); "
            f"use a smaller kernel or more padding"
        )
    return Window(tuple(kernel), tuple(stride), tuple(dilation), pad, (h, w), (ho, wo))


def pad_input(xp, x, win: Window, fill: float = 0.0, buffers=None):
    """``x`` (N, C, H, W) with the window's padding filled with ``fill`` (x itself if none).

    With a layer's ``buffers`` the padded array is reused while they are enabled (fast mode): its
    border is filled once, when it is made, and each call rewrites only the interior."""
    if not win.has_padding:
        return x
    t, b, l, r = win.pad
    n, c = x.shape[:2]
    hp, wp = win.padded_hw

    def make():
        return xp.full((n, c, hp, wp), fill, dtype=x.dtype)

    out = make() if buffers is None else buffers.group(("padded", x.shape, x.dtype, fill, xp), make)
    out[:, :, t:t + x.shape[2], l:l + x.shape[3]] = x
    return out


def unpad(dxp, win: Window):
    """The interior (unpadded) part of a gradient with respect to the padded input."""
    if not win.has_padding:
        return dxp
    t, _, l, _ = win.pad
    h, w = win.in_hw
    return dxp[:, :, t:t + h, l:l + w]


def im2col(xp, xpad, win: Window, one_gemm: bool = False, out=None):
    """Columns of the padded input: one strided view, one copy (into ``out`` when given).

    Row ``c·kh·kw + i·kw + j`` holds channel c at kernel offset (i, j), matching a weight
    of shape (O, C, kh, kw) reshaped to (O, C·kh·kw). The columns are (N, C·kh·kw, Ho·Wo), one
    matrix per sample for a batched GEMM, or with ``one_gemm`` (C·kh·kw, N·Ho·Wo): all samples
    side by side, for one GEMM. ``out``, if given, is an array of that shape whose reshape to the
    window shape is a view (a contiguous array, or the first rows of wider columns).
    """
    n, c = xpad.shape[:2]
    (kh, kw), (ho, wo) = win.kernel, win.out_hw
    sn, sc, sh, sw = xpad.strides
    view = xp.lib.stride_tricks.as_strided(
        xpad, shape=(n, c, kh, kw, ho, wo),
        strides=(sn, sc, sh * win.dilation[0], sw * win.dilation[1], sh * win.stride[0], sw * win.stride[1]),
    )
    if one_gemm:
        view = view.transpose(1, 2, 3, 0, 4, 5)
        shape = (c * kh * kw, n * ho * wo)
    else:
        shape = (n, c * kh * kw, ho * wo)
    return _columns(view, shape, out)


def _columns(view, shape, out):
    """The strided window ``view`` copied once into columns of ``shape``: a new array, or
    ``out`` (a reused buffer, or a slice of one whose reshape to ``view.shape`` is a view)."""
    if out is None:
        return view.reshape(shape)
    out.reshape(view.shape)[...] = view
    return out


def col2im(xp, cols, win: Window, channels: int, batch: int | None = None):
    """Adjoint of :func:`im2col`: sum the columns back onto the padded input, as kh·kw
    strided slab adds; returns (N, C, Hp, Wp). Give ``batch`` (N) for ``one_gemm`` columns."""
    (kh, kw), (ho, wo) = win.kernel, win.out_hw
    if batch is None:
        n = cols.shape[0]
        c6 = cols.reshape(n, channels, kh, kw, ho, wo)
    else:  # (C·kh·kw, N·P) -> a (N, C, kh, kw, Ho, Wo) view
        n = batch
        c6 = cols.reshape(channels, kh, kw, n, ho, wo).transpose(3, 0, 1, 2, 4, 5)
    dxp = xp.zeros((n, channels) + win.padded_hw, dtype=cols.dtype)
    for i, j in win.offsets():
        rs, cs = win.offset_slices(i, j)
        dxp[:, :, rs, cs] += c6[:, :, i, j]
    return dxp


def pad_channels_last(xp, x, win: Window, out=None):
    """NCHW ``x`` as a zero-padded NHWC array (one transposing copy into the interior). A reused
    ``out`` must have a zero border: only the interior is written."""
    t, b, l, r = win.pad
    n, c, h, w = x.shape
    if out is None:
        out = xp.zeros((n,) + win.padded_hw + (c,), dtype=x.dtype)
    out[:, t:t + h, l:l + w, :] = x.transpose(0, 2, 3, 1)
    return out


def im2col_channels_last(xp, xpad, win: Window, out=None):
    """Columns (N·Ho·Wo, kh·kw·C) of a padded NHWC input: one strided view and one copy whose
    inner runs are C contiguous channels (NCHW columns have runs of only Wo pixels, which is
    what makes small images slow). Column ``(i·kw + j)·C + c`` is channel c at offset (i, j)."""
    n, _, _, c = xpad.shape
    (kh, kw), (ho, wo) = win.kernel, win.out_hw
    sn, sh, sw, sc = xpad.strides
    view = xp.lib.stride_tricks.as_strided(
        xpad, shape=(n, ho, wo, kh, kw, c),
        strides=(sn, sh * win.stride[0], sw * win.stride[1], sh * win.dilation[0], sw * win.dilation[1], sc))
    return _columns(view, (n * ho * wo, kh * kw * c), out)


def col2im_channels_last(xp, cols, win: Window, channels: int, batch: int):
    """Adjoint of :func:`im2col_channels_last`: (N, Hp, Wp, C) from columns (N·Ho·Wo, kh·kw·C)."""
    (kh, kw), (ho, wo) = win.kernel, win.out_hw
    c6 = cols.reshape(batch, ho, wo, kh, kw, channels)
    dxp = xp.zeros((batch,) + win.padded_hw + (channels,), dtype=cols.dtype)
    for i, j in win.offsets():
        rs, cs = win.offset_slices(i, j)
        dxp[:, rs, cs, :] += c6[:, :, :, i, j, :]
    return dxp


def expect_image(layer, input_shape) -> tuple[int, int, int]:
    """(C, H, W) from a per-sample shape, or a ShapeError naming the layer."""
    layer.expect_rank(input_shape, 3, "(N, C, H, W) images (channels first)")
    return tuple(int(s) for s in input_shape)
