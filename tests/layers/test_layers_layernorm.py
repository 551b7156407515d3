"""LayerNorm: per-sample statistics over the trailing axes, gradients, and PyTorch as an oracle."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun.errors import ShapeError
from dlrun.layers.layernorm import LayerNorm
from layer_numgrad import check_gradients, make


def ln(shape, dtype=np.float64, **opts):
    layer = LayerNorm(**opts)
    make(layer, shape, dtype)
    rng = np.random.default_rng(9)
    for p in (layer.gamma, layer.beta):
        p.data[...] = rng.uniform(0.5, 2.0, p.data.shape)
    return layer


CASES = [((6,), 1), ((3, 5), 1), ((3, 5), 2), ((2, 4, 5), 3)]


@pytest.mark.parametrize("shape,axes", CASES)
def test_layernorm_closed_form_per_sample(shape, axes):
    layer = ln(shape, axes=axes)
    x = 3.0 + 2.0 * np.random.default_rng(0).standard_normal((4,) + shape)
    red = tuple(range(x.ndim - axes, x.ndim))
    mu, var = x.mean(axis=red, keepdims=True), x.var(axis=red, keepdims=True)
    expected = (x - mu) / np.sqrt(var + 1e-5) * layer.gamma.data + layer.beta.data
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12, atol=1e-12)
    assert layer.gamma.data.shape == shape[len(shape) - axes:]
    layer.training = False  # no running statistics: evaluation is the same function
    np.testing.assert_allclose(layer.forward(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,axes", CASES)
def test_layernorm_gradients(shape, axes):
    layer = ln(shape, axes=axes)
    x = np.random.default_rng(1).standard_normal((3,) + shape)
    assert check_gradients(layer, x) > 0


def test_layernorm_without_scale_and_center_and_float32():
    layer = ln((5,), scale=False, center=False)
    assert not layer.gamma.trainable and not layer.beta.trainable
    x = np.random.default_rng(2).standard_normal((4, 5))
    layer.gamma.data[...] = 1.0
    layer.beta.data[...] = 0.0
    y = layer.forward(x)
    np.testing.assert_allclose(y.mean(axis=1), 0, atol=1e-12)
    check_gradients(layer, x)
    f32 = ln((5,), np.float32)
    y32 = f32.forward(x.astype(np.float32))
    assert y32.dtype == np.float32 and f32.backward(y32).dtype == np.float32
    assert f32.gamma.grad.dtype == np.float32


def test_layernorm_axes_beyond_the_sample_rank_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"LayerNorm\(axes=3\) normalises 3 trailing axes, but each sample has "
                                          r"shape \(4, 5\) \(2 axes\)"):
        make(LayerNorm(axes=3), (4, 5), np.float64)


@pytest.mark.parametrize("shape,axes", CASES)
def test_layernorm_matches_torch_when_available(shape, axes):
    torch = pytest.importorskip("torch")
    layer = ln(shape, axes=axes)
    x = np.random.default_rng(3).standard_normal((4,) + shape)
    dy = np.random.default_rng(4).standard_normal(x.shape)
    t = torch.tensor(x, requires_grad=True)
    w = torch.tensor(layer.gamma.data, requires_grad=True)
    b = torch.tensor(layer.beta.data, requires_grad=True)
    ref = torch.nn.functional.layer_norm(t, shape[len(shape) - axes:], w, b, eps=1e-5)
    ref.backward(torch.tensor(dy))
    np.testing.assert_allclose(layer.forward(x), ref.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.backward(dy), t.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.gamma.grad, w.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.beta.grad, b.grad.numpy(), rtol=1e-10, atol=1e-12)
