"""New initializers: statistics against closed forms (large shapes, sampling tolerance),
orthogonality, truncation bounds, determinism by seed."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dlrun import registry
from dlrun.model import Sequential

NEW = ["lecun_uniform", "lecun_normal", "orthogonal", "truncated_normal"]


def draw(spec, shape, fan_in=500, fan_out=400, seed=0):
    return registry.initializers.build(spec)(shape, fan_in, fan_out, np.random.default_rng(seed))


@pytest.mark.parametrize("spec,var", [("lecun_uniform", 1 / 500), ("lecun_normal", 1 / 500),
                                      ({"type": "lecun_normal", "gain": 2.0}, 4 / 500)])
def test_lecun_variance_is_gain_squared_over_fan_in(spec, var):
    w = draw(spec, (400, 500))  # 200,000 draws: the sample variance is within ~1 % of the truth
    assert w.var() == pytest.approx(var, rel=0.03)
    assert abs(w.mean()) < 4 * math.sqrt(var / w.size)


def test_lecun_uniform_bound():
    w = draw("lecun_uniform", (400, 500))
    a = math.sqrt(3 / 500)
    assert np.abs(w).max() <= a and np.abs(w).max() > 0.99 * a


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (50, 50), (16, 3, 3, 3), (8, 4, 5)])
def test_orthogonal(shape):
    w = draw("orthogonal", shape)
    assert w.shape == shape
    m = w.reshape(shape[0], -1)
    gram = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
    np.testing.assert_allclose(gram, np.eye(len(gram)), atol=1e-12)


def test_orthogonal_gain_and_sign_correction():
    w = draw({"type": "orthogonal", "gain": 2.0}, (10, 6), seed=3)
    np.testing.assert_allclose(w.T @ w, 4 * np.eye(6), atol=1e-12)
    # with R's diagonal made positive, Q's first column is A's first column normalised
    # (Gram–Schmidt); without the sign correction LAPACK's Q_00 would always be ≤ 0
    a = np.random.default_rng(3).standard_normal((10, 6))
    np.testing.assert_allclose(w[:, 0], 2 * a[:, 0] / np.linalg.norm(a[:, 0]), rtol=1e-12)


def test_orthogonal_needs_two_dimensions_and_reaches_the_layer():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        draw("orthogonal", (5,))
    layer = registry.layers.build({"type": "Linear", "units": 4, "weight_initializer": "orthogonal"})
    Sequential([layer], (9,), dtype=np.float64, seed=0)
    np.testing.assert_allclose(layer.weight.data @ layer.weight.data.T, np.eye(4), atol=1e-12)


def test_truncated_normal_bounds_and_variance():
    w = draw({"type": "truncated_normal", "mean": 0.5, "std": 0.2}, (400, 500))
    assert np.abs(w - 0.5).max() <= 0.4
    assert np.abs(w - 0.5).max() > 0.39  # the tails are kept up to the bound
    phi = math.exp(-2) / math.sqrt(2 * math.pi)  # the standard normal density at 2
    mass = math.erf(2 / math.sqrt(2))  # P(|x| <= 2)
    factor = 1 - 2 * 2 * phi / mass  # variance of N(0,1) truncated to [-2, 2]: about 0.774
    assert w.var() == pytest.approx(factor * 0.04, rel=0.03)
    assert w.mean() == pytest.approx(0.5, abs=4 * 0.2 / math.sqrt(w.size))


@pytest.mark.parametrize("name", NEW)
def test_deterministic_by_seed(name):
    a, b, c = draw(name, (30, 20), seed=7), draw(name, (30, 20), seed=7), draw(name, (30, 20), seed=8)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.dtype == np.float64


@pytest.mark.parametrize("name", NEW)
def test_documented(name):
    assert registry.initializers.summary(name).startswith(("w ~", "W ="))
    assert all(o.doc for o in registry.initializers.options(name))


def test_default_fans_of_a_plugin_kernel_follow_pytorch():
    """A layer that gives add_param no fans gets fan_in = in·kh·kw and fan_out = out·kh·kw for an
    (out, in, kh, kw) weight (fan_out was out alone: xavier variance 2.4x too large)."""
    from dlrun.backend import CPU
    from dlrun.layers import Layer

    seen = {}

    def record(shape, fan_in, fan_out, rng):
        seen["fans"] = (fan_in, fan_out)
        return np.zeros(shape)

    layer = Layer()
    layer.setup(CPU, np.float64, np.random.default_rng(0), CPU.rng(0))
    layer.add_param("kernel", (64, 32, 3, 3), record)
    assert seen["fans"] == (32 * 9, 64 * 9)
    layer.add_param("weight", (10, 7), record)
    assert seen["fans"] == (7, 10)
    layer.add_param("bias", (10,), record)
    assert seen["fans"] == (10, 10)
    w = layer.add_param("w", (64, 32, 3, 3), registry.initializers.build("xavier_normal")).data
    assert w.var() == pytest.approx(2 / (288 + 576), rel=0.05)


def test_add_param_takes_an_initializer_name_or_spec_as_a_config_would():
    """add_param("w", shape, "xavier_uniform") raised "'str' object is not callable" (Keras'
    add_weight takes names); a misspelt name gets did-you-mean, a non-callable a clear error."""
    from dlrun.backend import CPU
    from dlrun.errors import ConfigError
    from dlrun.layers import Layer

    def layer():
        a = Layer()
        a.setup(CPU, np.float64, np.random.default_rng(3), CPU.rng(0))
        return a

    by_name = layer().add_param("w", (30, 20), "xavier_uniform").data
    by_object = layer().add_param("w", (30, 20), registry.initializers.build("xavier_uniform")).data
    assert np.array_equal(by_name, by_object) and by_name.any()
    spec = layer().add_param("w", (30, 20), {"type": "normal", "std": 0.5}).data
    assert spec.std() == pytest.approx(0.5, rel=0.2)
    with pytest.raises(ConfigError, match=r"add_param\(.w.\): initializer: unknown initializer .xavier_unifrm. .*did you mean xavier_uniform"):
        layer().add_param("w", (3, 2), "xavier_unifrm")
    with pytest.raises(ConfigError, match=r"add_param\(.w.\): initializer\.std: expected a number >= 0, got -0\.5"):
        layer().add_param("w", (3, 2), {"type": "normal", "std": -0.5})  # (the option was not named)
    with pytest.raises(TypeError, match="initializer must be an initializer name such as 'xavier_uniform'"):
        layer().add_param("w", (3, 2), 0.1)


def test_an_initializer_returning_the_wrong_shape_is_named(tmp_path):
    from conftest import run_cli, write

    write(tmp_path / "initt.py", '''\
import numpy as np
from dlrun.registry import initializers


@initializers.register("transposed")
class Transposed(initializers.base):
    """Returns the transposed shape."""

    def __call__(self, shape, fan_in, fan_out, rng):
        return np.zeros(shape[::-1])
''')
    cfg = write(tmp_path / "c.yaml", "plugins: [initt.py]\ndata: {type: spiral}\nmodel: [{type: Linear, units: 8, "
                                     "weight_initializer: transposed}]\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n")
    r = run_cli("check", cfg)
    assert r.code == 2, r.err
    assert ("c.yaml:3: model[0]: Linear: add_param('weight'): the initializer transposed returned an array that has "
            "shape (2, 8), expected (8, 2)") in r.err


def test_zeros_ones_and_constant_closed_forms():
    rng = np.random.default_rng(0)
    for spec, value in (("zeros", 0.0), ("ones", 1.0), ({"type": "constant", "value": -2.5}, -2.5)):
        w = registry.initializers.build(spec)((3, 4), 4, 3, rng)
        assert w.shape == (3, 4) and np.all(w == value), spec


def test_an_initializer_that_overflows_the_model_dtype_is_a_config_error_at_the_layer():
    # constant 1e300 became inf in float32: a RuntimeWarning, then "NaN in forward" at the first step
    from dlrun import registry
    from dlrun.backend import CPU
    from dlrun.errors import DlrunError
    from dlrun.layers.base import Layer
    from dlrun.model import Sequential

    def linear():
        return registry.layers.build({"type": "Linear", "units": 2,
                                      "weight_initializer": {"type": "constant", "value": 1e300}})

    with pytest.raises(DlrunError) as e:
        Sequential([linear()], (3,), CPU, np.float32)
    assert e.value.where.path == "model[0]" and "not finite in float32" in e.value.message
    assert "largest magnitude given 1e+300" in e.value.message
    Sequential([linear()], (3,), CPU, np.float64)  # float64 holds it

    class Masked(Layer):  # a given -inf (a mask) is meant
        def build(self, input_shape):
            self.add_param("mask", input_shape, value=np.full(input_shape, -np.inf), trainable=False)
            return input_shape

    Sequential([Masked()], (3,), CPU, np.float32)
