"""Unit tests of the core components against closed forms and float64 numeric gradients."""
import numpy as np
import pytest

from dlrun import registry
from dlrun.layers.base import Parameter
from dlrun.errors import NonFiniteError
from dlrun.model import Sequential
from dlrun.training.trainer import Trainer
from numgrad import check_layer, numeric_grad


def built(spec, shape, seed=0):
    layer = registry.layers.build(spec)
    Sequential([layer], shape, dtype=np.float64, seed=seed)
    return layer


@pytest.mark.parametrize("spec", ["ReLU", {"type": "LeakyReLU", "slope": 0.1}, "Sigmoid", "Tanh", "Softmax",
                                  {"type": "Linear", "units": 4}, {"type": "Linear", "units": 4, "use_bias": False}])
def test_layer_gradients_match_central_differences(spec):
    layer = built(spec, (5,))
    x = np.random.default_rng(1).standard_normal((7, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep off the ReLU kink
    check_layer(layer, x)


def test_activation_closed_forms():
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 3.0]])
    assert np.array_equal(built("ReLU", (5,)).forward(x), [[0, 0, 0, 0.5, 3.0]])
    np.testing.assert_allclose(built({"type": "LeakyReLU", "slope": 0.1}, (5,)).forward(x), [[-0.2, -0.05, 0, 0.5, 3.0]])
    np.testing.assert_allclose(built("Sigmoid", (5,)).forward(x), 1 / (1 + np.exp(-x)))
    np.testing.assert_allclose(built("Tanh", (5,)).forward(x), np.tanh(x))
    s = built("Softmax", (5,)).forward(x)
    np.testing.assert_allclose(s, np.exp(x) / np.exp(x).sum())


def test_sigmoid_and_softmax_do_not_overflow():
    x = np.array([[-1000.0, 1000.0]])
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        np.testing.assert_allclose(built("Sigmoid", (2,)).forward(x), [[0.0, 1.0]])
        np.testing.assert_allclose(built("Softmax", (2,)).forward(x), [[0.0, 1.0]])


def test_linear_forward_closed_form_and_float32():
    lin = registry.layers.build({"type": "Linear", "units": 2})
    Sequential([lin], (3,), dtype=np.float32)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = lin.forward(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x @ lin.weight.data.T + lin.bias.data, rtol=1e-6)
    dx = lin.backward(np.ones((2, 2), dtype=np.float32))
    assert dx.dtype == lin.weight.grad.dtype == lin.bias.grad.dtype == np.float32


def test_softmax_cross_entropy_value_and_gradient():
    loss = registry.losses.build("SoftmaxCrossEntropy")
    rng = np.random.default_rng(0)
    z, y = rng.standard_normal((6, 4)), np.array([0, 1, 2, 3, 1, 1])
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    assert loss.forward(z, y) == pytest.approx(-np.log(p[np.arange(6), y]).mean(), rel=1e-12)
    g = loss.backward()
    np.testing.assert_allclose(g, numeric_grad(lambda: float(loss.forward(z, y)), z), atol=1e-8)
    big = np.array([[1000.0, 0.0], [0.0, -1000.0]])
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        assert loss.forward(big, np.array([1, 1])) == pytest.approx((1000.0 + 1000.0) / 2)


def test_mse_value_and_gradient():
    loss = registry.losses.build("MSE")
    rng = np.random.default_rng(0)
    z, y = rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
    assert loss.forward(z, y) == pytest.approx(((z - y) ** 2).mean())
    np.testing.assert_allclose(loss.backward(), numeric_grad(lambda: float(loss.forward(z, y)), z), atol=1e-8)
    assert loss.forward(np.ones((3, 1)), np.zeros(3)) == 1.0  # (N,) targets for one output


@pytest.mark.parametrize("name,fan_in,fan_out,var", [
    ("xavier_uniform", 300, 200, 2 / 500), ("xavier_normal", 300, 200, 2 / 500),
    ("he_uniform", 300, 200, 2 / 300), ("he_normal", 300, 200, 2 / 300)])
def test_variance_scaling_initializers(name, fan_in, fan_out, var):
    w = registry.initializers.build(name)((fan_out, fan_in), fan_in, fan_out, np.random.default_rng(0))
    assert w.shape == (fan_out, fan_in)
    assert w.var() == pytest.approx(var, rel=0.03) and abs(w.mean()) < 0.01 * np.sqrt(var) * 10
    if "uniform" in name:
        assert np.abs(w).max() <= np.sqrt(3 * var)


def test_simple_initializers():
    rng = np.random.default_rng(0)
    assert not registry.initializers.build("zeros")((3, 2), 2, 3, rng).any()
    assert (registry.initializers.build({"type": "constant", "value": 0.5})((2,), 1, 2, rng) == 0.5).all()
    u = registry.initializers.build({"type": "uniform", "low": 2, "high": 3})((1000,), 1, 1, rng)
    assert u.min() >= 2 and u.max() < 3
    n = registry.initializers.build({"type": "normal", "mean": 1, "std": 0.1})((20000,), 1, 1, rng)
    assert n.mean() == pytest.approx(1, abs=0.01) and n.std() == pytest.approx(0.1, rel=0.03)


@pytest.mark.parametrize("name,pen,grad", [
    ("L2", lambda w: 0.1 * (w ** 2).sum(), lambda w: 0.2 * w),
    ("L1", lambda w: 0.1 * np.abs(w).sum(), lambda w: 0.1 * np.sign(w))])
def test_regularizers(name, pen, grad):
    reg = registry.regularizers.build({"type": name, "strength": 0.1})
    w = np.array([-1.5, 0.0, 2.0], dtype=np.float32)
    assert reg.penalty(w) == pytest.approx(pen(w))
    g = np.ones_like(w)
    reg.add_gradient(w, g)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, 1 + grad(w), rtol=1e-6)
    # float32 weights whose squares (or sum) overflow float32 still have a finite penalty: it
    # is accumulated in float64 (weights of 1e30 reported an inf loss that the guard let pass)
    big = np.full(1000, 3e35, dtype=np.float32)
    assert reg.penalty(big) == pytest.approx(pen(big.astype(np.float64)), rel=1e-6) and np.isfinite(reg.penalty(big))


@pytest.mark.parametrize("name,grad", [("L2", lambda w: 0.2 * w), ("L1", lambda w: 0.1 * np.sign(w))])
def test_a_regularizer_serves_tensors_of_every_shape_from_one_scratch_buffer(name, grad):
    """One regularizer, shared by the run's tensors: each call computes into a view of one
    buffer (no array per tensor per step), and a call never sees what an earlier one left."""
    reg = registry.regularizers.build({"type": name, "strength": 0.1})
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(s).astype(np.float32) for s in ((7,), (4, 3), (2, 3, 2), (3,))]
    buffers = set()
    for w in ws:
        g = np.ones_like(w)
        reg.add_gradient(w, g)
        np.testing.assert_array_equal(g, np.float32(1) + grad(w).astype(np.float32))
        buffers.add(id(reg._scratch))
    assert len(buffers) == 2 and reg._scratch.size == 12  # grown once, for the 12-element tensor
    g = np.ones((5,))  # another dtype gets its own buffer, and float64 stays float64
    reg.add_gradient(np.full(5, 2.0), g)
    assert reg._scratch.dtype == np.float64 and g.dtype == np.float64


def test_an_epoch_whose_reported_loss_is_not_finite_stops_training():
    """The guard checks the loss as reported (data loss plus penalty), not the data loss alone."""
    model = Sequential([registry.layers.build({"type": "Linear", "units": 2})], (2,), seed=0, dtype=np.float64)
    model.layers[0].weight.data[...] = 1e160  # finite, but the L2 penalty overflows float64
    trainer = Trainer(model, registry.losses.build("MSE"), registry.optimizers.build({"type": "SGD", "learning_rate": 1e-300}),
                      registry.regularizers.build({"type": "L2", "strength": 1.0}), batch_size=None)
    x = np.zeros((4, 2))
    with pytest.raises(NonFiniteError, match="epoch 1"), np.errstate(over="ignore"):
        trainer.fit(x, np.zeros((4, 2)), epochs=2)


def _param(w, g):
    return Parameter(np.array(w, dtype=np.float64), np.array(g, dtype=np.float64))


def test_sgd_momentum_nesterov_weight_decay_hand_steps():
    opt = registry.optimizers.build({"type": "SGD", "learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.01})
    p = _param([1.0, -2.0], [0.5, 0.5])
    opt.setup([("w", p)])
    opt.step()  # g = 0.5 + 0.01 w = [0.51, 0.48]; v = g; w -= 0.1 v
    np.testing.assert_allclose(p.data, [1 - 0.051, -2 - 0.048])
    p.grad[...] = [0.5, 0.5]
    w1 = p.data.copy()
    opt.step()  # g = 0.5 + 0.01 w1; v = 0.9 v + g
    g = 0.5 + 0.01 * w1
    v = 0.9 * np.array([0.51, 0.48]) + g
    np.testing.assert_allclose(p.data, w1 - 0.1 * v)

    nes = registry.optimizers.build({"type": "SGD", "learning_rate": 0.1, "momentum": 0.5, "nesterov": True})
    q = _param([1.0], [2.0])
    nes.setup([("w", q)])
    nes.step()  # v = 2; update = g + 0.5 v = 3
    np.testing.assert_allclose(q.data, [1 - 0.3])


def test_adam_hand_steps():
    opt = registry.optimizers.build({"type": "Adam", "learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8})
    p = _param([1.0, 2.0], [0.1, -0.3])
    opt.setup([("w", p)])
    m = v = np.zeros(2)
    w = p.data.copy()
    for t, g in enumerate([np.array([0.1, -0.3]), np.array([-0.2, 0.4])], start=1):
        p.grad[...] = g
        opt.step()
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        w = w - 0.01 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-8)
        np.testing.assert_allclose(p.data, w, rtol=1e-12)


def test_optimizers_skip_constants_and_keep_float32():
    opt = registry.optimizers.build({"type": "Adam"})
    w = Parameter(np.ones(3, dtype=np.float32), np.full(3, 0.5, dtype=np.float32))
    c = Parameter(np.ones(3, dtype=np.float32), None, trainable=False)
    opt.setup([("w", w), ("c", c)])
    opt.step()
    assert w.data.dtype == np.float32 and (w.data < 1).all() and (c.data == 1).all()
