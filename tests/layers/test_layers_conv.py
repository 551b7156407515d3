"""Conv2D and the pooling layers against slow direct references, float64 gradient checks and
edge shapes (stride > 1, padding, dilation, odd sizes, overlapping pools, ties)."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun.errors import ConfigError, ShapeError
from dlrun.layers.avgpool2d import AvgPool2D
from dlrun.layers.conv2d import LAYOUTS, Conv2D, choose_layout
from dlrun.layers.globalavgpool2d import GlobalAvgPool2D
from dlrun.layers.maxpool2d import MaxPool2D
from dlrun.registry import layers
from layer_numgrad import check_gradients, make


def reference_conv(x, w, b, stride, pad, dilation):
    """Direct convolution, one output pixel at a time (slow; tests only)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    t, btm, l, r = pad
    xp = np.zeros((n, c, h + t + btm, wd + l + r))
    xp[:, :, t:t + h, l:l + wd] = x
    ho = (xp.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (xp.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    for a in range(ho):
        for bb in range(wo):
            rows = a * stride[0] + dilation[0] * np.arange(kh)
            cols = bb * stride[1] + dilation[1] * np.arange(kw)
            patch = xp[:, :, rows][:, :, :, cols]  # (n, c, kh, kw)
            out[:, :, a, bb] = np.einsum("nchw,ochw->no", patch, w)
    return out + (0 if b is None else b[None, :, None, None])


def reference_pool(x, k, s, p, reduce, fill):
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * p[0], w + 2 * p[1]), fill)
    xp[:, :, p[0]:p[0] + h, p[1]:p[1] + w] = x
    ho, wo = (xp.shape[2] - k[0]) // s[0] + 1, (xp.shape[3] - k[1]) // s[1] + 1
    out = np.zeros((n, c, ho, wo))
    arg = np.zeros((n, c, ho, wo), dtype=int)
    for a in range(ho):
        for bb in range(wo):
            win = xp[:, :, a * s[0]:a * s[0] + k[0], bb * s[1]:bb * s[1] + k[1]].reshape(n, c, -1)
            out[:, :, a, bb] = reduce(win, axis=-1)
            arg[:, :, a, bb] = win.argmax(axis=-1)
    return out, arg


CONV_CASES = [
    dict(filters=3, kernel_size=3),
    dict(filters=2, kernel_size=3, stride=2, padding=1),
    dict(filters=2, kernel_size=[3, 2], stride=[2, 1], padding=[1, 0]),
    dict(filters=2, kernel_size=2, dilation=2),
    dict(filters=2, kernel_size=3, padding="same"),
    dict(filters=2, kernel_size=3, stride=2, padding="same"),
    dict(filters=3, kernel_size=1, use_bias=False),
    dict(filters=2, kernel_size=4, stride=3, padding=2, dilation=[1, 2]),
]


def build_conv(opts, shape, dtype=np.float64, layout=None):
    layer = layers.build({"type": "Conv2D", **opts})
    out_shape = make(layer, shape, dtype)
    if layout is not None:  # force a layout (build picks it from the channels and output size)
        layer.layout = layout
    if layer.bias is not None:  # a nonzero bias, so its effect is visible
        layer.bias.data[...] = np.random.default_rng(5).standard_normal(layer.bias.shape)
    return layer, out_shape


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("opts", CONV_CASES)
def test_conv_forward_matches_direct_convolution(opts, layout):
    shape = (2, 7, 5)  # odd, non-square
    layer, out_shape = build_conv(opts, shape, layout=layout)
    x = np.random.default_rng(1).standard_normal((3,) + shape)
    y = layer.forward(x)
    b = None if layer.bias is None else layer.bias.data
    ref = reference_conv(x, layer.weight.data, b, layer.stride, layer.win.pad, layer.dilation)
    assert y.shape == (3,) + out_shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("opts", CONV_CASES)
def test_conv_gradients(opts, layout):
    layer, _ = build_conv(opts, (2, 6, 5), layout=layout)
    x = np.random.default_rng(2).standard_normal((2, 2, 6, 5))
    assert check_gradients(layer, x) == x.size


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("opts", CONV_CASES[:3])
def test_conv_with_reused_buffers_matches_fresh_arrays(opts, layout):
    """Fast mode writes columns and outputs into per-shape buffers: every call, including a
    smaller last batch, must equal the plain computation, and backward must see the columns
    of its own forward."""
    pooled, _ = build_conv(opts, (2, 7, 5), layout=layout)
    plain, _ = build_conv(opts, (2, 7, 5), layout=layout)
    pooled.buffers.enabled = True
    rng = np.random.default_rng(9)
    for n in (3, 3, 2):
        x = rng.standard_normal((n, 2, 7, 5))
        y = pooled.forward(x)
        np.testing.assert_allclose(y, plain.forward(x), rtol=1e-12, atol=1e-12)
        dy = rng.standard_normal(y.shape)
        np.testing.assert_allclose(pooled.backward(dy), plain.backward(dy), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(pooled.weight.grad, plain.weight.grad, rtol=1e-12, atol=1e-12)
        if pooled.bias is not None:  # from the ones row of reused columns: it must survive each im2col
            np.testing.assert_allclose(pooled.bias.grad, plain.bias.grad, rtol=1e-12, atol=1e-12)
    assert len(pooled.buffers) > 0


def test_conv_layout_follows_the_output_size():
    small, _ = build_conv(dict(filters=2, kernel_size=3, padding="same"), (1, 8, 8))  # 64 output pixels
    large, _ = build_conv(dict(filters=2, kernel_size=3, padding="same"), (1, 9, 8))  # 72
    assert small.one_gemm and not large.one_gemm
    assert small.layout == "one_gemm" and large.layout == "batched"
    # many channels on few output columns: channels-last columns (runs of C contiguous floats)
    assert [choose_layout(c, hw) for c, hw in ((32, (4, 4)), (3, (4, 4)), (32, (9, 8)), (8, (8, 8)))] == [
        "channels_last", "one_gemm", "batched", "channels_last"]
    assert choose_layout(32, (4, 4), cpu=False) == "one_gemm"  # channels-last not yet run on a GPU


def test_conv_same_padding_keeps_size_and_matches_keras_rule():
    layer, out = build_conv(dict(filters=4, kernel_size=3, padding="same"), (1, 8, 8))
    assert out == (4, 8, 8)
    layer, out = build_conv(dict(filters=4, kernel_size=3, stride=2, padding="same"), (1, 7, 8))
    assert out == (4, 4, 4)  # ceil(7/2), ceil(8/2)
    assert layer.win.pad == (1, 1, 0, 1)  # the odd extra column goes right


def test_conv_float32_stays_float32():
    layer, _ = build_conv(dict(filters=4, kernel_size=3, padding=1), (3, 6, 6), dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    y = layer.forward(x)
    dx = layer.backward(np.ones_like(y))
    assert y.dtype == dx.dtype == layer.weight.grad.dtype == layer.bias.grad.dtype == np.float32


def test_conv_kernel_larger_than_input_is_a_shape_error():
    with pytest.raises(ShapeError, match="does not fit"):
        build_conv(dict(filters=2, kernel_size=5), (1, 4, 4))
    with pytest.raises(ShapeError, match=r"\(N, C, H, W\)"):
        build_conv(dict(filters=2), (16,))


def test_conv_bad_option_is_a_config_error():
    with pytest.raises(ConfigError, match="kernel_size"):
        layers.build({"type": "Conv2D", "filters": 2, "kernel_size": [3, 3, 3]})
    with pytest.raises(ConfigError, match="padding"):
        layers.build({"type": "Conv2D", "filters": 2, "padding": "full"})


POOL_CASES = [
    dict(pool_size=2),  # the common non-overlapping case
    dict(pool_size=2, stride=2),  # odd input: the last row/column is dropped
    dict(pool_size=3, stride=1),  # overlapping
    dict(pool_size=3, stride=2),  # overlapping, stride > 1
    dict(pool_size=[2, 3], stride=[1, 2]),
    dict(pool_size=3, stride=2, padding=1),
    dict(pool_size=2, padding=1),
]


@pytest.mark.parametrize("opts", POOL_CASES)
def test_maxpool_matches_reference_and_argmax(opts):
    layer = layers.build({"type": "MaxPool2D", **opts})
    out_shape = make(layer, (2, 7, 5))
    x = np.random.default_rng(3).standard_normal((3, 2, 7, 5))
    y = layer.forward(x)
    ref, arg = reference_pool(x, layer.pool_size, layer.stride, layer.padding, np.max, -np.inf)
    assert y.shape == (3,) + out_shape == ref.shape
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(layer.branch_signature(), arg)


@pytest.mark.parametrize("opts", POOL_CASES)
def test_maxpool_gradients(opts):
    layer = layers.build({"type": "MaxPool2D", **opts})
    make(layer, (2, 6, 5))
    x = np.random.default_rng(4).standard_normal((2, 2, 6, 5))
    assert check_gradients(layer, x) > x.size // 2


@pytest.mark.parametrize("opts", POOL_CASES)
def test_maxpool_ties_send_gradient_to_exactly_one_element(opts):
    layer = layers.build({"type": "MaxPool2D", **opts})
    make(layer, (1, 6, 6))
    x = np.zeros((2, 1, 6, 6))  # every window is one big tie (as after ReLU)
    y = layer.forward(x)
    dx = layer.backward(np.ones_like(y))
    # each output's gradient lands on one element: the first of its window (row-major)
    ref = np.zeros_like(x)
    pad = layer.padding
    for a in range(y.shape[2]):
        for b in range(y.shape[3]):
            r = max(a * layer.stride[0] - pad[0], 0)
            c = max(b * layer.stride[1] - pad[1], 0)
            ref[:, :, r, c] += 1
    np.testing.assert_array_equal(dx, ref)
    assert dx.sum() == y.size


@pytest.mark.parametrize("opts", POOL_CASES)
def test_avgpool_matches_reference_and_gradients(opts):
    layer = layers.build({"type": "AvgPool2D", **opts})
    out_shape = make(layer, (2, 7, 5))
    x = np.random.default_rng(5).standard_normal((3, 2, 7, 5))
    ref, _ = reference_pool(x, layer.pool_size, layer.stride, layer.padding, np.mean, 0.0)
    y = layer.forward(x)
    assert y.shape == (3,) + out_shape
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-14)
    assert check_gradients(layer, x) == x.size


@pytest.mark.parametrize("kind", ["MaxPool2D", "AvgPool2D"])
@pytest.mark.parametrize("opts", POOL_CASES)
def test_pool_with_reused_buffers_matches_the_reference(kind, opts):
    """Fast mode keeps the padded copy between calls and rewrites only its interior: every call,
    including a smaller last batch and inputs larger than the previous call's, must still see
    the -inf (max) or zero (average) border, and backward must use its own forward."""
    pooled, plain = layers.build({"type": kind, **opts}), layers.build({"type": kind, **opts})
    make(pooled, (2, 7, 5))
    make(plain, (2, 7, 5))
    pooled.buffers.enabled = True
    reduce, fill = (np.max, -np.inf) if kind == "MaxPool2D" else (np.mean, 0.0)
    rng = np.random.default_rng(11)
    for n, scale in ((3, 1.0), (3, -50.0), (2, 1.0)):  # all-negative inputs would expose a 0 border
        x = scale * np.abs(rng.standard_normal((n, 2, 7, 5)))
        y = pooled.forward(x)
        ref, _ = reference_pool(x, pooled.pool_size, pooled.stride, pooled.padding, reduce, fill)
        np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(y, plain.forward(x))
        dy = rng.standard_normal(y.shape)
        np.testing.assert_array_equal(pooled.backward(dy), plain.backward(dy))


def test_pool_padding_over_half_the_window_is_rejected():
    with pytest.raises(ConfigError, match="at most half"):
        layers.build({"type": "MaxPool2D", "pool_size": 2, "padding": 2})


def test_global_avg_pool_closed_form_and_gradients():
    layer = GlobalAvgPool2D()
    assert make(layer, (3, 4, 5)) == (3,)
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 5))
    np.testing.assert_allclose(layer.forward(x), x.mean(axis=(2, 3)))
    dx = layer.backward(np.ones((2, 3)))
    np.testing.assert_allclose(dx, np.full(x.shape, 1 / 20))
    assert check_gradients(layer, x) == x.size


def test_pool_float32_stays_float32():
    for cls in (MaxPool2D, AvgPool2D, GlobalAvgPool2D):
        layer = cls()
        make(layer, (2, 4, 4), np.float32)
        x = np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32)
        y = layer.forward(x)
        assert y.dtype == layer.backward(np.ones_like(y)).dtype == np.float32


def test_direct_construction_defaults():
    conv = Conv2D(filters=4)
    assert conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (0, 0)
    pool = MaxPool2D(pool_size=3)
    assert pool.stride == (3, 3)


@pytest.mark.parametrize("hw", [(7, 6), (6, 6)])  # (6, 6): 2x2 windows tile the input exactly
@pytest.mark.parametrize("opts", POOL_CASES + [dict(pool_size=[1, 3], stride=[1, 2]), dict(pool_size=[3, 1])])
def test_maxpool_partial_ties_follow_row_major_first_winner(opts, hw):
    """Windows where some but not all entries share the maximum (0/1 inputs): the gradient goes
    to the first maximum in row-major window order, as the reference argmax says, also when a
    second forward writes into the reused output buffer."""
    layer = layers.build({"type": "MaxPool2D", **opts})
    make(layer, (2,) + hw)
    layer.buffers.enabled = True
    rng = np.random.default_rng(8)
    for _ in range(2):
        x = rng.integers(0, 2, (3, 2) + hw).astype(np.float64)
        y = layer.forward(x)
        ref, arg = reference_pool(x, layer.pool_size, layer.stride, layer.padding, np.max, -np.inf)
        np.testing.assert_array_equal(y, ref)
        np.testing.assert_array_equal(layer.branch_signature(), arg)
        dy = rng.standard_normal(y.shape)
        expected = np.zeros_like(x)
        kh, kw = layer.pool_size
        for idx in np.ndindex(y.shape):
            n, c, a, b = idx
            i, j = divmod(int(arg[idx]), kw)
            r, col = a * layer.stride[0] + i - layer.padding[0], b * layer.stride[1] + j - layer.padding[1]
            expected[n, c, r, col] += dy[idx]
        np.testing.assert_allclose(layer.backward(dy), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("opts", POOL_CASES + [dict(pool_size=[3, 1]), dict(pool_size=[2, 3])])
def test_maxpool_training_and_evaluation_paths_agree(opts, dtype):
    """Training copies disjoint windows' sub-grids into one contiguous array; evaluation reads
    strided views. Both must give the same maxima (NaN and ties included) in either dtype."""
    layer = layers.build({"type": "MaxPool2D", **opts})
    make(layer, (2, 7, 8), dtype)
    x = np.random.default_rng(11).integers(-3, 4, (3, 2, 7, 8)).astype(dtype)
    if dtype != np.int64:
        x[0, 0, 0, 0] = np.nan
    train = layer.forward(x).copy()
    arg = layer.branch_signature().copy()
    layer.training = False
    np.testing.assert_array_equal(layer.forward(x), train)
    if dtype != np.int64:  # reference_pool's argmax: NaN windows aside, the first maximum
        ref, ref_arg = reference_pool(np.nan_to_num(x, nan=-np.inf), layer.pool_size, layer.stride, layer.padding,
                                      np.max, -np.inf)
        keep = ~np.isnan(train)
        np.testing.assert_array_equal(arg[keep], ref_arg[keep])
