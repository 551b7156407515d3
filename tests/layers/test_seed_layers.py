"""Forward reference tests of the seed layers (gradcheck checks backward against forward; these
check forward against the formulas), plus LSoftmax's m = 1 and annealing, and constant scales."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import CPU
from dlrun.gradcheck import PASS, Settings, check_layer


def make(name, shape, **opts):
    layer = registry.layers.build({"type": name, **opts})
    layer.setup(CPU, np.float64, np.random.default_rng(0), CPU.rng(0))
    layer.build(shape)
    return layer


@pytest.fixture
def data():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 3))
    y = np.array([0, 1, 2, 3, 0, 0, 2, 1, 3])
    return rng, x, y


def test_large_margin_fc_forward(data):
    _, x, y = data
    layer = make("LargeMarginFC", (3,), units=4, k=0.25)
    f = x @ layer.weight.data.T
    expect = f.copy()
    for i in range(len(x)):  # the formula, one sample at a time
        if f[i, y[i]] > 0:
            expect[i, y[i]] *= 0.25
    assert (f[np.arange(9), y] > 0).any() and (f[np.arange(9), y] <= 0).any()
    np.testing.assert_array_equal(layer.forward(x, y), expect)
    layer.training = False
    np.testing.assert_array_equal(layer.forward(x, y), f)


def lsoftmax_reference(x, w, y, m, beta):
    """Target logits from the paper's definition with cos(mθ) = np.cos(m·arccos c)."""
    out = x @ w.T
    for i in range(len(x)):
        a, b = np.linalg.norm(x[i]), np.linalg.norm(w[y[i]])
        c = out[i, y[i]] / (a * b)
        theta = np.arccos(c)
        k = min(int(np.floor(m * theta / np.pi)), m - 1)
        psi = (-1) ** k * np.cos(m * theta) - 2 * k
        out[i, y[i]] = (a * b * psi + beta * out[i, y[i]]) / (1 + beta)
    return out


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("beta", [0.0, 1.0, 10.0])
def test_lsoftmax_forward_matches_the_definition(data, m, beta):
    _, x, y = data
    layer = make("LSoftmax", (3,), units=4, margin=m, beta=beta)
    np.testing.assert_allclose(layer.forward(x, y), lsoftmax_reference(x, layer.weight.data, y, m, beta),
                               rtol=1e-10, atol=1e-12)
    layer.training = False
    np.testing.assert_array_equal(layer.forward(x, y), x @ layer.weight.data.T)


def test_lsoftmax_psi_is_monotone_decreasing():
    """ψ(θ) on [0, π] for m = 3 via a layer whose x sweeps the angle to w."""
    layer = make("LSoftmax", (2,), units=1, margin=3, beta=0.0)
    layer.weight.data[...] = [[1.0, 0.0]]
    theta = np.linspace(0.01, np.pi - 0.01, 200)
    x = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    psi = layer.forward(x, np.zeros(200, dtype=np.int64))[:, 0]
    assert (np.diff(psi) < 0).all()


def test_lsoftmax_margin_one_is_a_plain_fc(data):
    rng, x, y = data
    layer = make("LSoftmax", (3,), units=4, margin=1, beta=0.7, scale=1.0)
    w = layer.weight.data
    np.testing.assert_allclose(layer.forward(x, y), x @ w.T, rtol=1e-12)
    dy = rng.standard_normal((9, 4))
    np.testing.assert_allclose(layer.backward(dy), dy @ w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.weight.grad, dy.T @ x, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lsoftmax_zero_input_row_is_a_plain_fc_row(data, m, dtype):
    """A sample whose features are all 0 (common after a ReLU) has no angle to its class weight:
    its logits and gradients are the plain FC ones (0/0 made them NaN, and NaN spread into
    every row of the weight gradient)."""
    rng, x, y = data
    layer = make("LSoftmax", (3,), units=4, margin=m, beta=0.5, scale=1.0)
    plain = make("LSoftmax", (3,), units=4, margin=m, beta=0.5, scale=1.0)
    x = x.astype(dtype)
    x[[2, 5]] = 0
    layer.weight.data = layer.weight.data.astype(dtype)
    layer.weight.grad = np.zeros_like(layer.weight.data)
    out = layer.forward(x, y)
    assert out.dtype == dtype and np.isfinite(out).all()
    np.testing.assert_array_equal(out[[2, 5]], 0)
    dy = rng.standard_normal((9, 4)).astype(dtype)
    dx = layer.backward(dy)
    assert np.isfinite(dx).all() and np.isfinite(layer.weight.grad).all()
    w = layer.weight.data
    np.testing.assert_allclose(dx[[2, 5]], dy[[2, 5]] @ w, rtol=1e-6)
    # the other rows are unchanged by the zero rows: the same as a batch without them
    keep = [i for i in range(9) if i not in (2, 5)]
    plain.weight.data = w.astype(np.float64)
    ref = plain.forward(x[keep].astype(np.float64), y[keep])
    np.testing.assert_allclose(out[keep], ref, rtol=1e-5 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(dx[keep], plain.backward(dy[keep].astype(np.float64)), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(layer.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-6)  # zero rows add x = 0


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("beta", [0.0, 1.0, 10.0])
def test_lsoftmax_gradcheck_every_margin(m, beta):
    report = check_layer("LSoftmax", {"margin": m, "beta": beta, "scale": 0.9})
    assert report.verdict == PASS, [(t.name, t.worst) for t in report.tensors]


def test_lsoftmax_anneals_beta_per_training_step_and_gradcheck_freezes_it(data):
    rng, x, y = data
    layer = make("LSoftmax", (3,), units=4, beta=10.0, beta_min=2.0, scale=0.5)
    for expect in (5.0, 2.5, 2.0, 2.0):
        layer.forward(x, y)
        layer.backward(rng.standard_normal((9, 4)))
        assert layer.beta == expect
    layer.training = False
    layer.forward(x, y)
    layer.backward(rng.standard_normal((9, 4)))
    assert layer.beta == 2.0  # evaluation is not a training step
    report = check_layer("LSoftmax", {"beta": 10.0, "scale": 0.5})
    state = next(a for a in report.aux if a.name == "state")
    assert report.verdict == PASS and "beta" in state.detail


def test_requ_forward_and_multiply_by_two():
    x = np.array([[-2.0, -0.0, 0.5, 3.0]])
    np.testing.assert_array_equal(make("ReQU", (4,)).forward(x), [[0.0, 0.0, 0.25, 9.0]])
    np.testing.assert_array_equal(make("MultiplyByTwo", (4,)).forward(x), 2 * x)


def test_minmax_normalization_forward():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 2, 3))
    out = make("MinMaxNormalization", (2, 3)).forward(x)
    np.testing.assert_allclose(out, (x - x.min()) / (x.max() - x.min()), rtol=1e-14)
    assert out.min() == 0.0 and out.max() == 1.0
    np.testing.assert_array_equal(make("MinMaxNormalization", (2,)).forward(np.ones((3, 2))), np.zeros((3, 2)))


def test_normalized_dense_forward_and_infers_input_size():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 5))
    layer = make("NormalizedDense", (5,), hidden_units=3, scales=[2.0])
    assert layer.weights.data.shape == (3, 5) and not layer.scales.trainable and layer.scales.grad is None
    n = (x - x.min()) / (x.max() - x.min())
    np.testing.assert_allclose(layer.forward(x), 2.0 * (n @ layer.weights.data.T), rtol=1e-13)


def test_training_does_not_change_the_constant_scales(tmp_path):
    from dlrun.runs.assembly import assemble
    from dlrun.config import load_config

    path = tmp_path / "scales.yaml"
    path.write_text(
        "seed: 0\ndata: {type: spiral, points_per_class: 20}\n"
        "model:\n  - {type: NormalizedDense, hidden_units: 4, scales: [2.0, 0.5, 1.0, 3.0]}\n"
        "  - Tanh\n  - {type: Linear, units: 3}\nloss: SoftmaxCrossEntropy\n"
        "optimizer: {type: SGD, learning_rate: 0.5, momentum: 0.9}\n"
        "regularizer: {type: L2, strength: 0.01}\ntrain: {epochs: 5, batch_size: 16}\n")
    a = assemble(load_config(path))
    ds, trainer = a.data, a.trainer
    layer = trainer.model.layers[0]
    w0, s0 = layer.weights.data.copy(), layer.scales.data.copy()
    trainer.fit(ds.x, ds.y, epochs=5)
    np.testing.assert_array_equal(layer.scales.data, s0)
    assert not np.array_equal(layer.weights.data, w0)


@pytest.mark.parametrize("config", ["iris_requ.yaml", "large_margin.yaml"])
def test_toy_configs_reach_95_percent(config):
    from dlrun.runs.assembly import assemble
    from dlrun.config import load_config
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / config)
    a = assemble(cfg)
    ds, trainer = a.data, a.trainer
    trainer.fit(ds.x, ds.y, epochs=cfg.train.epochs)
    assert trainer.evaluate(ds.x, ds.y)["accuracy"] >= 0.95  # evaluation mode: no margin applied


def test_gradcheck_float32_passes_with_loosened_tolerances():
    report = check_layer("LargeMarginFC", settings=Settings(dtype="float32"))
    assert report.verdict == PASS and report.warnings and report.settings["float32_eps"] == 1e-3
