"""BatchNorm and Dropout: closed-form statistics, train/eval behaviour, float64 gradients."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun.errors import ConfigError
from dlrun.layers.batchnorm import BatchNorm
from dlrun.layers.dropout import Dropout
from dlrun.model import Sequential
from dlrun.registry import layers
from layer_numgrad import check_gradients, make


def bn(shape, dtype=np.float64, **opts):
    layer = BatchNorm(**opts)
    make(layer, shape, dtype)
    rng = np.random.default_rng(9)
    layer.gamma.data[...] = rng.uniform(0.5, 2.0, layer.gamma.shape)
    layer.beta.data[...] = rng.standard_normal(layer.beta.shape)
    return layer


@pytest.mark.parametrize("shape,axes", [((5,), (0,)), ((3, 4, 5), (0, 2, 3))])
def test_batchnorm_train_mode_statistics(shape, axes):
    layer = bn(shape)
    x = 3.0 + 2.0 * np.random.default_rng(0).standard_normal((8,) + shape)
    y = layer.forward(x)
    b = (1, -1) + (1,) * (len(shape) - 1)
    mu, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    expected = layer.gamma.data.reshape(b) * (x - mu) / np.sqrt(var + 1e-5) + layer.beta.data.reshape(b)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    # normalised per feature/channel: mean beta, std gamma (up to eps)
    np.testing.assert_allclose(y.mean(axis=axes), layer.beta.data, atol=1e-12)
    np.testing.assert_allclose(y.std(axis=axes), layer.gamma.data, rtol=1e-5)


def test_batchnorm_running_statistics_update_and_eval_use():
    layer = bn((3, 2, 2), momentum=0.8)
    rng = np.random.default_rng(1)
    x1 = rng.standard_normal((4, 3, 2, 2)) * 2 + 1
    x2 = rng.standard_normal((4, 3, 2, 2)) - 3
    layer.forward(x1)
    layer.forward(x2)
    m = 4 * 2 * 2
    rm, rv = np.zeros(3), np.ones(3)
    for x in (x1, x2):
        rm = 0.8 * rm + 0.2 * x.mean(axis=(0, 2, 3))
        rv = 0.8 * rv + 0.2 * x.var(axis=(0, 2, 3)) * m / (m - 1)  # unbiased, as documented
    np.testing.assert_allclose(layer.running_mean, rm, rtol=1e-12)
    np.testing.assert_allclose(layer.running_var, rv, rtol=1e-12)

    layer.training = False
    x3 = rng.standard_normal((2, 3, 2, 2))
    y = layer.forward(x3)
    b = (1, 3, 1, 1)
    expected = (layer.gamma.data.reshape(b) * (x3 - rm.reshape(b)) / np.sqrt(rv.reshape(b) + 1e-5)
                + layer.beta.data.reshape(b))
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    np.testing.assert_allclose(layer.running_mean, rm)  # eval leaves the statistics alone
    # one sample in eval mode is deterministic and independent of the rest of the batch
    np.testing.assert_allclose(layer.forward(x3[:1]), y[:1])


@pytest.mark.parametrize("shape", [(3,), (3, 1, 1)])
def test_batchnorm_one_value_per_feature_leaves_the_running_statistics_alone(shape):
    """A training batch of one (N, D) sample (or one 1x1 map) has no unbiased variance: it used to
    pull running_var towards 0 (m/(m − 1) taken as 1), so evaluation over-scaled activations."""
    layer = bn(shape, momentum=0.5)
    rng = np.random.default_rng(2)
    layer.forward(rng.standard_normal((4,) + shape) * 3 + 1)
    rm, rv = layer.running_mean.copy(), layer.running_var.copy()
    y = layer.forward(rng.standard_normal((1,) + shape))
    np.testing.assert_array_equal(layer.running_mean, rm)
    np.testing.assert_array_equal(layer.running_var, rv)
    np.testing.assert_allclose(y.reshape(-1), layer.beta.data)  # x − μ = 0: the output is β
    dx = layer.backward(np.ones_like(y))
    assert np.isfinite(dx).all() and np.isfinite(layer.gamma.grad).all()
    # one sample of a 2x2 map has 4 values per channel: the statistics update as usual
    big = bn((3, 2, 2), momentum=0.5)
    big.forward(rng.standard_normal((1, 3, 2, 2)))
    assert not np.array_equal(big.running_var, np.ones(3))


@pytest.mark.parametrize("shape", [(4,), (2, 3, 3)])
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_gradients(shape, training):
    layer = bn(shape)
    x = np.random.default_rng(2).standard_normal((5,) + shape)
    layer.forward(x)  # nontrivial running statistics for the eval case
    layer.training = training
    assert check_gradients(layer, x, rtol=1e-5) == x.size


def test_batchnorm_without_scale_and_center_has_frozen_params():
    layer = bn((4,), scale=False, center=False)
    assert not layer.gamma.trainable and not layer.beta.trainable
    x = np.random.default_rng(3).standard_normal((6, 4))
    check_gradients(layer, x)


def test_batchnorm_float32_and_state_in_model_checkpoint_arrays():
    model = Sequential([layers.build({"type": "BatchNorm"})], (3, 4, 4), dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((5, 3, 4, 4)).astype(np.float32) + 2
    y = model.forward(x)
    assert y.dtype == model.backward(np.ones_like(y)).dtype == np.float32
    arrays = model.state_arrays()
    assert arrays["0.state.running_mean"].dtype == np.float32
    np.testing.assert_allclose(arrays["0.state.running_mean"], 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5)
    other = Sequential([layers.build({"type": "BatchNorm"})], (3, 4, 4), dtype=np.float32)
    other.load_state_arrays(arrays)
    np.testing.assert_array_equal(other.layers[0].running_var, model.layers[0].running_var)


def test_dropout_train_mode_mask_and_scaling():
    layer = Dropout(rate=0.25)
    make(layer, (1000,))
    x = np.random.default_rng(0).uniform(1, 2, (100, 1000))
    y = layer.forward(x)
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / 0.75)  # inverted dropout: scale by 1/(1-rate)
    dropped = 1 - kept.mean()
    assert abs(dropped - 0.25) < 5 * np.sqrt(0.25 * 0.75 / x.size)  # 5 sigma of a binomial
    dy = np.random.default_rng(1).standard_normal(x.shape)
    dx = layer.backward(dy)
    np.testing.assert_allclose(dx, np.where(kept, dy / 0.75, 0.0))


def test_dropout_eval_and_rate_zero_are_identity():
    layer = Dropout(rate=0.5)
    make(layer, (10,))
    x = np.random.default_rng(0).standard_normal((4, 10))
    layer.training = False
    assert layer.forward(x) is x
    assert layer.backward(x) is x
    zero = Dropout(rate=0.0)
    make(zero, (10,))
    np.testing.assert_array_equal(zero.forward(x), x)


def test_dropout_is_seeded_by_the_model_generator():
    def mask(seed):
        model = Sequential([Dropout(rate=0.5)], (50,), seed=seed)
        return model.forward(np.ones((4, 50))) != 0

    np.testing.assert_array_equal(mask(3), mask(3))
    assert not np.array_equal(mask(3), mask(4))


def test_dropout_float32_and_gradients():
    layer = Dropout(rate=0.4)
    make(layer, (6,), np.float32)
    x = np.ones((3, 6), dtype=np.float32)
    y = layer.forward(x)
    assert y.dtype == np.float32 and set(np.unique(y)) <= {0.0, np.float32(1 / 0.6)}
    layer64 = Dropout(rate=0.4)
    make(layer64, (6,))
    check_gradients(layer64, np.random.default_rng(0).standard_normal((3, 6)))


def test_dropout_rate_one_is_rejected():
    with pytest.raises(ConfigError, match="rate"):
        layers.build({"type": "Dropout", "rate": 1.0})


def test_phase_declarations():
    assert BatchNorm.has_phase and BatchNorm.state == ("running_mean", "running_var")
    assert Dropout.has_phase and Dropout.stochastic


def test_dropout_drops_the_same_units_in_float32_and_float64():
    # a float32 gradcheck differentiates a float64 copy of the layer: both must draw one mask
    def kept(dtype):
        model = Sequential([Dropout(rate=0.3)], (64,), dtype=dtype, seed=5)
        return model.forward(np.ones((8, 64), dtype=dtype)) != 0
    np.testing.assert_array_equal(kept(np.float32), kept(np.float64))
