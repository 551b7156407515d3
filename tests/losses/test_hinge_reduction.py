"""Hinge against PyTorch's MultiMarginLoss: the default sums each sample's terms over the classes
(C times torch's loss and gradient); ``class_reduction: mean`` divides by C too and is torch's.
Checked against the closed form, and against torch.nn.MultiMarginLoss when it is installed."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.config import load_config
from dlrun.errors import ConfigError
from conftest import write


def hinge(**options):
    return registry.losses.build({"type": "Hinge", **options})


# two samples, three classes, margin 1: sample 0 (label 0) violates with class 1 by 2 and
# class 2 by 0.2; sample 1 (label 2) keeps both margins
Z = np.array([[1.0, 2.0, 0.2], [0.5, 0.0, 3.0]])
Y = np.array([0, 2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_and_mean_over_classes_closed_form(dtype):
    z = Z.astype(dtype)
    loss = hinge()
    assert loss.forward(z, Y) == pytest.approx((2.0 + 0.2) / 2, rel=1e-6)  # (1/N) Σ_i Σ_j
    grad_sum = np.array([[-1.0, 0.5, 0.5], [0, 0, 0]])  # [m > 0]/N, and −Σ at the label
    np.testing.assert_allclose(loss.backward(), grad_sum, rtol=1e-6)
    mean = hinge(class_reduction="mean")
    value = mean.forward(z, Y)
    assert np.asarray(value).dtype == dtype
    assert value == pytest.approx((2.0 + 0.2) / (2 * 3), rel=1e-6)  # (1/(N·C)) Σ_i Σ_j
    grad = mean.backward()
    assert grad.dtype == dtype
    np.testing.assert_allclose(grad, grad_sum / 3, rtol=1e-6)


def test_mean_over_classes_is_the_sum_over_c_with_weights_and_margin():
    rng = np.random.default_rng(0)
    z, y = rng.standard_normal((9, 5)), rng.integers(0, 5, 9)
    for options in ({}, {"margin": 0.4}, {"class_weights": [0.5, 2.0, 1.0, 3.0, 0.0]}):
        total, mean = hinge(**options), hinge(class_reduction="mean", **options)
        assert mean.forward(z, y) == pytest.approx(total.forward(z, y) / 5, rel=1e-14)
        np.testing.assert_allclose(mean.backward(), total.backward() / 5, rtol=1e-14)


def test_the_default_is_the_sum_and_the_repr_names_mean():
    assert hinge().class_reduction == "sum" and repr(hinge()) == "Hinge(margin=1.0)"
    assert repr(hinge(class_reduction="mean")) == "Hinge(margin=1.0, class_reduction='mean')"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [{}, {"margin": 0.7}, {"class_weights": [0.5, 2.0, 1.0, 3.0, 1.0]}],
                         ids=["plain", "margin", "weights"])
def test_against_torch_multi_margin_loss(options, dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    z, y = rng.standard_normal((16, 5)).astype(dtype), rng.integers(0, 5, 16)
    kw = {"margin": options.get("margin", 1.0)}
    if "class_weights" in options:
        kw["weight"] = torch.tensor(options["class_weights"], dtype=torch.float64)
    zt = torch.tensor(z.astype(np.float64), requires_grad=True)
    want = torch.nn.MultiMarginLoss(**kw)(zt, torch.tensor(y))
    want.backward()
    want, want_grad = want.item(), zt.grad.numpy()
    tol = 1e-6 if dtype == np.float32 else 1e-13
    mean = hinge(class_reduction="mean", **options)
    assert float(mean.forward(z.copy(), y)) == pytest.approx(want, rel=tol)
    np.testing.assert_allclose(mean.backward(), want_grad, rtol=tol, atol=tol)
    total = hinge(**options)  # the default: C = 5 times torch's, loss and gradient
    assert float(total.forward(z.copy(), y)) == pytest.approx(5 * want, rel=tol)
    np.testing.assert_allclose(total.backward(), 5 * want_grad, rtol=tol, atol=tol)


def test_the_option_is_checked_in_a_config(tmp_path):
    base = "data: spiral\nmodel: [{type: Linear, units: 3}]\noptimizer: SGD\n"
    cfg = load_config(write(tmp_path / "ok.yaml", base + "loss: {type: Hinge, class_reduction: mean}\n"))
    assert cfg is not None
    with pytest.raises(ConfigError, match="class_reduction: expected one of 'sum', 'mean', got 'average'"):
        load_config(write(tmp_path / "bad.yaml", base + "loss: {type: Hinge, class_reduction: average}\n"))


@pytest.mark.parametrize("extra", [(), ("--set", "class_reduction=mean"),
                                   ("--set", "class_reduction=mean", "--set", "class_weights=[0.5,2,1,3]")])
def test_gradcheck_passes_with_either_reduction(cli, extra):
    r = cli("gradcheck", "Hinge", *extra)
    assert r.code == 0 and "RESULT Hinge: PASS" in r.out, r.out + r.err
