"""Losses: closed-form values, float64 central-difference gradients, prediction helpers."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dlrun import registry
from dlrun.errors import ShapeError


def loss(spec):
    return registry.losses.build(spec)


def numeric_grad(l, z, y, eps=1e-6):
    g = np.zeros_like(z)
    for i in np.ndindex(z.shape):  # a test oracle: element by element is the point
        zp, zm = z.copy(), z.copy()
        zp[i] += eps
        zm[i] -= eps
        g[i] = (l.forward(zp, y) - l.forward(zm, y)) / (2 * eps)
    return g


def log_softmax(z):
    s = z - z.max(axis=1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=1, keepdims=True))


RNG = np.random.default_rng(0)
Z = RNG.standard_normal((6, 4)) * 2
LABELS = np.array([0, 3, 1, 2, 3, 0])
CASES = {
    "BinaryCrossEntropy": (RNG.standard_normal((6, 1)) * 3, np.array([0, 1, 1, 0, 1, 0])),
    "BinaryCrossEntropy-flat": (RNG.standard_normal(6) * 3, np.array([0, 1, 1, 0, 1, 0])),
    "NLL": (log_softmax(Z), LABELS),
    "Hinge": (Z, LABELS),
    "Hinge-margin": (Z, LABELS),
    "Huber": (RNG.standard_normal((6, 2)) * 2, RNG.standard_normal((6, 2))),
    "Huber-delta": (RNG.standard_normal((6, 2)) * 2, RNG.standard_normal((6, 2))),
    "SoftmaxCrossEntropy": (Z, LABELS),
    "SoftmaxCrossEntropy-smoothed": (Z, LABELS),
    "MSE": (RNG.standard_normal((6, 2)), RNG.standard_normal((6, 2))),
}
SPECS = {"BinaryCrossEntropy-flat": "BinaryCrossEntropy", "Hinge-margin": {"type": "Hinge", "margin": 2.5},
         "Huber-delta": {"type": "Huber", "delta": 0.3},
         "SoftmaxCrossEntropy-smoothed": {"type": "SoftmaxCrossEntropy", "label_smoothing": 0.2}}


@pytest.mark.parametrize("case", CASES)
def test_backward_matches_central_differences_float64(case):
    z, y = CASES[case]
    l = loss(SPECS.get(case, case))
    if "Hinge" in case:  # keep clear of the kinks, where the difference quotient is undefined
        m = z - z[np.arange(6), y][:, None] + l.margin
        assert np.abs(m).min() > 1e-3
    if "Huber" in case:
        assert np.abs(np.abs(z - y) - l.delta).min() > 1e-3
    l.forward(z, y)
    analytic = l.backward()
    assert analytic.shape == z.shape
    np.testing.assert_allclose(analytic, numeric_grad(l, z, y), rtol=1e-6, atol=1e-9)


def test_bce_closed_forms():
    l = loss("BinaryCrossEntropy")
    assert l.forward(np.zeros((4, 1)), np.array([0, 1, 0, 1])) == pytest.approx(math.log(2), rel=1e-15)
    want = (math.log1p(math.exp(-2)) + math.log1p(math.exp(-3))) / 2  # z=2,y=1 and z=-3,y=0
    assert l.forward(np.array([[2.0], [-3.0]]), np.array([1, 0])) == pytest.approx(want, rel=1e-15)
    z = np.array([0.7, -1.2, 2.5])
    y = np.array([1, 1, 0])
    s = 1 / (1 + np.exp(-z))
    naive = -np.mean(y * np.log(s) + (1 - y) * np.log(1 - s))
    assert l.forward(z, y) == pytest.approx(naive, rel=1e-12)
    np.testing.assert_allclose(l.backward(), (s - y) / 3, rtol=1e-12)


def test_bce_is_stable_for_huge_logits_in_float32():
    l = loss("BinaryCrossEntropy")
    z = np.array([[1000.0], [-1000.0], [1000.0], [-1000.0]], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is fine
        value = l.forward(z, np.array([0, 1, 1, 0]))
        d = l.backward()
    assert value.dtype == np.float32 and d.dtype == np.float32
    assert float(value) == pytest.approx(500.0)  # two terms of 1000, two of 0, over 4
    np.testing.assert_allclose(d[:, 0], [0.25, -0.25, 0.0, 0.0], atol=1e-7)


def test_bce_gradient_keeps_its_relative_accuracy_on_both_sides_in_float32():
    """σ(z) − y for y = 1 and large z: σ(z) rounds to 1 in float32 from z ≈ 17, so the old
    gradient was 0 there while its mirror image (y = 0, z < 0) was exact."""
    l = loss("BinaryCrossEntropy")
    z = np.array([20.0, -20.0, 17.0, -17.0, 0.3, -5.0], dtype=np.float32)
    y = np.array([1, 0, 1, 0, 0, 1])
    l.forward(z, y)
    d = l.backward()
    assert d.dtype == np.float32
    z64 = z.astype(np.float64)
    exact = np.where(y == 1, -1 / (1 + np.exp(z64)), 1 / (1 + np.exp(-z64))) / len(z)  # σ(z) − y
    np.testing.assert_allclose(d, exact, rtol=1e-6)
    soft = np.array([0.25, 0.75])  # targets in [0, 1] too
    l.forward(np.array([1.5, -0.5]), soft)
    np.testing.assert_allclose(l.backward(), (1 / (1 + np.exp(-np.array([1.5, -0.5]))) - soft) / 2, rtol=1e-14)


def test_bce_predict_probabilities_and_shape_checks():
    l = loss("BinaryCrossEntropy")
    z = np.array([[-2.0], [0.5], [3.0]])
    assert l.predict(z).tolist() == [0, 1, 1]
    p = l.probabilities(z)
    np.testing.assert_allclose(p[:, 1], 1 / (1 + np.exp(-z[:, 0])))
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    with pytest.raises(ShapeError, match="one logit per sample"):
        l.forward(np.zeros((3, 2)), np.array([0, 1, 0]))
    assert l.check_outputs(2, 1) is None
    assert "takes labels 0 and 1" in l.check_outputs(3, 1)
    assert "set the last layer's units to 1" in l.check_outputs(2, 2)


def test_nll_after_log_softmax_equals_softmax_cross_entropy():
    nll, ce = loss("NLL"), loss("SoftmaxCrossEntropy")
    assert nll.forward(np.log(np.full((2, 4), 0.25)), np.array([1, 2])) == pytest.approx(math.log(4))
    assert nll.forward(log_softmax(Z), LABELS) == pytest.approx(ce.forward(Z, LABELS), rel=1e-14)
    want = np.zeros((6, 4))
    want[np.arange(6), LABELS] = -1 / 6
    np.testing.assert_array_equal(nll.backward(), want)
    np.testing.assert_allclose(nll.probabilities(log_softmax(Z)), ce.probabilities(Z), rtol=1e-14)
    assert nll.predict(log_softmax(Z)).tolist() == Z.argmax(axis=1).tolist()


@pytest.mark.parametrize("classes", [4, 40])  # the column-wise path (<= 16 classes) and the axis-1 path
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("pooled", [False, True])
def test_label_smoothing_is_cross_entropy_against_the_mixed_target(classes, eps, pooled):
    """Oracle: -Σ_j t_j log softmax(z)_j with t = (1 − ε)·onehot(y) + ε/C written out in float64,
    the definition of torch.nn.CrossEntropyLoss(label_smoothing=ε); gradient (p − t)/N. Twice,
    so a reused buffer cannot hold the previous call's values."""
    rng = np.random.default_rng(classes)
    l = loss({"type": "SoftmaxCrossEntropy", "label_smoothing": eps})
    l.buffers.enabled = pooled
    for _ in range(2):
        z = (rng.standard_normal((7, classes)) * 5).astype(np.float32)
        y = rng.integers(0, classes, 7)
        z64 = z.astype(np.float64)
        t = (1 - eps) * np.eye(classes)[y] + eps / classes
        value = l.forward(z, y)
        d = l.backward()
        assert value.dtype == np.float32 and d.dtype == np.float32
        np.testing.assert_allclose(float(value), -(t * log_softmax(z64)).sum(axis=1).mean(), rtol=2e-6)
        np.testing.assert_allclose(d, (np.exp(log_softmax(z64)) - t) / 7, atol=2e-7)
        assert int(l.count_correct(z, y)) == int((z.argmax(axis=1) == y).sum())  # accuracy unchanged


def test_label_smoothing_is_checked_and_shown():
    assert repr(loss({"type": "SoftmaxCrossEntropy", "label_smoothing": 0.1})) == "SoftmaxCrossEntropy(label_smoothing=0.1)"
    assert repr(loss("SoftmaxCrossEntropy")) == "SoftmaxCrossEntropy()"
    from dlrun.errors import ConfigError
    with pytest.raises(ConfigError, match="label_smoothing"):
        loss({"type": "SoftmaxCrossEntropy", "label_smoothing": 1.5})
    with pytest.raises(ConfigError, match="did you mean label_smoothing"):
        loss({"type": "SoftmaxCrossEntropy", "label_smothing": 0.1})


def test_hinge_closed_form_cs231n_example():
    # the cs231n multiclass SVM example: per-sample losses 2.9, 0, 12.9
    z = np.array([[3.2, 5.1, -1.7], [1.3, 4.9, 2.0], [2.2, 2.5, -3.1]])
    y = np.array([0, 1, 2])
    l = loss("Hinge")
    assert l.forward(z, y) == pytest.approx((2.9 + 0.0 + 12.9) / 3, rel=1e-14)
    want = np.array([[-1, 1, 0], [0, 0, 0], [1, 1, -2]]) / 3
    np.testing.assert_allclose(l.backward(), want, rtol=1e-15)
    # margin 4: sample 2 now adds max(0, 1.3-4.9+4) + max(0, 2.0-4.9+4) = 0.4 + 1.1
    assert loss({"type": "Hinge", "margin": 4.0}).forward(z, y) == pytest.approx((5.9 + 1.5 + 18.9) / 3)
    assert l.predict(z).tolist() == [1, 1, 1]
    with pytest.raises(NotImplementedError):
        l.probabilities(z)


def test_huber_closed_forms():
    z, y = np.array([[0.5], [-2.0], [3.0]]), np.zeros(3)
    assert loss("Huber").forward(z, y) == pytest.approx((0.125 + 1.5 + 2.5) / 3, rel=1e-15)
    l = loss({"type": "Huber", "delta": 2.0})
    assert l.forward(z, y) == pytest.approx((0.125 + 2.0 + 4.0) / 3, rel=1e-15)
    np.testing.assert_allclose(l.backward(), np.array([[0.5], [-2.0], [2.0]]) / 3)
    small = np.array([[0.1, -0.2], [0.3, 0.05]])
    assert loss("Huber").forward(small, np.zeros((2, 2))) == pytest.approx(loss("MSE").forward(small, np.zeros((2, 2))) / 2)
    assert l.task == "regression" and l.predict(z) is z


@pytest.mark.parametrize("name,task", [("BinaryCrossEntropy", "classification"), ("NLL", "classification"),
                                       ("Hinge", "classification"), ("Huber", "regression")])
def test_registered_with_formula_summary_and_task(name, task):
    assert registry.losses.get(name).task == task
    summary = registry.losses.summary(name)
    assert "L =" in summary
    for o in registry.losses.options(name):
        assert o.doc, f"{name}.{o.name} is undocumented"
