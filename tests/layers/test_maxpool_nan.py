"""MaxPool2D on windows holding NaN: the maximum is NaN and the window's gradient goes to one
element, its NaN (the last one in row-major window order when there are several), as PyTorch's
max_pool2d does. Checked against a hand-worked example, a per-window reference and, when PyTorch
is installed, against torch.nn.functional.max_pool2d."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from kernel_emulation import reference
from dlrun.model import Sequential

NAN = np.nan
POOLS = [
    dict(pool_size=2),                             # disjoint windows (training copies the sub-grids)
    dict(pool_size=[3, 2]),                        # disjoint, not square, trailing rows dropped
    dict(pool_size=3, stride=1),                   # overlapping: a NaN can win several windows
    dict(pool_size=3, stride=2, padding=1),        # padded with -inf
    dict(pool_size=[2, 3], stride=[1, 2], padding=[1, 1]),
]

TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}


def build(opts, shape, dtype):
    layer = registry.layers.build({"type": "MaxPool2D", **opts})
    Sequential([layer], shape, dtype=dtype, seed=0)
    return layer


def nan_input(rng, shape, dtype, share=0.2):
    """ReLU-like values (ties at 0) with NaN in about ``share`` of the elements, so that windows
    hold none, one or several NaNs."""
    x = np.maximum(rng.standard_normal(shape), 0)
    x[rng.random(shape) < share] = NAN
    return x.astype(dtype)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_nan_window_is_nan_and_sends_its_gradient_to_its_last_nan(dtype, training):
    x = np.array([[[[1, NAN, 3, 4],
                    [NAN, 2, 5, 6],
                    [0, 0, 7, NAN],
                    [0, 0, 8, 9]]]], dtype=dtype)
    layer = build(dict(pool_size=2), (1, 4, 4), dtype)
    layer.training = training
    y = layer.forward(x)
    np.testing.assert_array_equal(y, np.array([[[[NAN, 6], [0, NAN]]]], dtype=dtype))
    dx = layer.backward(np.array([[[[1, 2], [3, 4]]]], dtype=dtype))
    # top left: NaN at (0, 1) and (1, 0), the last one wins; top right: 6; bottom left: four
    # zeros, the first one wins; bottom right: the NaN beats the larger 8 and 9
    np.testing.assert_array_equal(dx, np.array([[[[0, 0, 0, 0],
                                                  [1, 0, 0, 2],
                                                  [3, 0, 0, 4],
                                                  [0, 0, 0, 0]]]], dtype=dtype))
    np.testing.assert_array_equal(layer.branch_signature(), [[[[2, 3], [0, 1]]]])


def test_an_overlapping_nan_wins_every_window_it_is_in():
    x = np.array([[[[1, 2, 3],
                    [4, NAN, 5],
                    [6, 7, 8]]]])
    layer = build(dict(pool_size=2, stride=1), (1, 3, 3), np.float64)
    y = layer.forward(x)
    assert np.isnan(y).all()
    dx = layer.backward(np.array([[[[1.0, 2.0], [4.0, 8.0]]]]))
    np.testing.assert_array_equal(dx, [[[[0, 0, 0], [0, 15, 0], [0, 0, 0]]]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts", POOLS, ids=str)
def test_nan_windows_match_the_per_window_reference(opts, dtype):
    layer = build(opts, (2, 7, 8), dtype)
    layer.buffers.enabled = True  # reused buffers: the second batch must not see the first's NaNs
    rng = np.random.default_rng(5)
    for n, share in ((3, 0.2), (2, 0.0), (3, 0.05)):
        x = nan_input(rng, (n, 2, 7, 8), dtype, share)
        y = layer.forward(x.copy())
        dy = rng.standard_normal(y.shape).astype(dtype)
        ref_y, ref_dx = reference(x.astype(np.float64), layer, dy.astype(np.float64))
        np.testing.assert_array_equal(y, ref_y.astype(dtype))
        # overlapping windows add gradients in another order than the reference: rounding only
        np.testing.assert_allclose(layer.backward(dy), ref_dx, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts", POOLS, ids=str)
def test_nan_windows_match_torch_max_pool2d(opts, dtype):
    torch = pytest.importorskip("torch")
    layer = build(opts, (3, 9, 10), dtype)
    rng = np.random.default_rng(7)
    x = nan_input(rng, (4, 3, 9, 10), dtype)
    y = layer.forward(x.copy())
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = layer.backward(dy)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.max_pool2d(xt, layer.pool_size, layer.stride, layer.padding)
    yt.backward(torch.tensor(dy))
    assert np.isnan(y).any() and not np.isnan(y).all()
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_allclose(dx, xt.grad.numpy(), **TOL[dtype])  # same elements, summing order aside
