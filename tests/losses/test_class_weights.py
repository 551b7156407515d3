"""class_weights on the classification losses: a sample of class k counts w[k] times (Keras'
class_weight): closed forms, float64 differences, PyTorch as an oracle, errors, and training."""
from __future__ import annotations

import numpy as np
import pytest
from checkpoint_helpers import metrics_rows, train
from conftest import run_cli, write
from kernel_emulation import emulate
from test_losses import log_softmax, numeric_grad

from dlrun import registry
from dlrun.errors import ConfigError
from dlrun.model import Sequential
from dlrun.training.trainer import Trainer

RNG = np.random.default_rng(7)
Z = RNG.standard_normal((6, 4)) * 2
LABELS = np.array([0, 3, 1, 2, 3, 0])
W4 = [1.0, 2.5, 0.0, 4.0]  # class 2 weighs nothing
BINARY = (RNG.standard_normal((6, 1)) * 3, np.array([0, 1, 1, 0, 1, 0]))
CASES = {  # name: (spec, z, y)
    "SoftmaxCrossEntropy": ({"type": "SoftmaxCrossEntropy", "class_weights": W4}, Z, LABELS),
    "SoftmaxCrossEntropy-smoothed": ({"type": "SoftmaxCrossEntropy", "class_weights": W4, "label_smoothing": 0.2},
                                     Z, LABELS),
    "SoftmaxCrossEntropy-40": ({"type": "SoftmaxCrossEntropy", "class_weights": list(RNG.uniform(0, 3, 40))},
                               RNG.standard_normal((6, 40)), RNG.integers(0, 40, 6)),  # the axis-1 path
    "NLL": ({"type": "NLL", "class_weights": W4}, log_softmax(Z), LABELS),
    "Hinge": ({"type": "Hinge", "class_weights": W4, "margin": 0.7}, Z, LABELS),
    "BinaryCrossEntropy": ({"type": "BinaryCrossEntropy", "class_weights": [0.3, 2.0]}, *BINARY),
}


def unweighted(spec):
    return registry.losses.build({k: v for k, v in spec.items() if k != "class_weights"})


def sample_weights(spec, y):
    return np.asarray(spec["class_weights"])[y]


@pytest.mark.parametrize("case", CASES)
def test_weighted_backward_matches_central_differences_float64(case):
    spec, z, y = CASES[case]
    loss = registry.losses.build(spec)
    loss.forward(z, y)
    np.testing.assert_allclose(loss.backward(), numeric_grad(loss, z, y), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_each_sample_counts_its_class_weight_times(case, pooled):
    """Closed form: L_w = (1/N) Σ_i w[y_i]·ℓ_i, row i of ∂L_w/∂z is w[y_i] times the unweighted
    row; checked through one-sample losses of the unweighted loss. Twice, so reused buffers show."""
    spec, z, y = CASES[case]
    loss, plain = registry.losses.build(spec), unweighted(spec)
    loss.buffers.enabled = pooled
    w = sample_weights(spec, y)
    rows = [(float(plain.forward(z[i:i + 1], y[i:i + 1])), plain.backward().copy()) for i in range(len(y))]
    for _ in range(2):
        value, d = float(loss.forward(z, y)), loss.backward()
        assert value == pytest.approx(sum(wi * li for wi, (li, _) in zip(w, rows)) / len(y), rel=1e-12)
        np.testing.assert_allclose(d, np.concatenate([wi * g for wi, (_, g) in zip(w, rows)]) / len(y),
                                   rtol=1e-12, atol=1e-15)
    if spec["class_weights"] is W4:
        assert (y == 2).any() and not d[y == 2].any()  # class 2 weighs 0: its samples' rows are 0


@pytest.mark.parametrize("case", CASES)
def test_float32_stays_float32(case):
    spec, z, y = CASES[case]
    loss = registry.losses.build(spec)
    value = loss.forward(z.astype(np.float32), y)
    assert np.asarray(value).dtype == np.float32 and loss.backward().dtype == np.float32
    assert float(value) == pytest.approx(float(registry.losses.build(spec).forward(z, y)), rel=1e-5)


def test_equal_weights_scale_the_loss_and_ones_change_nothing():
    for spec, z, y in CASES.values():
        k = len(spec["class_weights"])
        ones, threes = (registry.losses.build({**spec, "class_weights": [v] * k}) for v in (1, 3))
        plain = unweighted(spec)
        assert float(ones.forward(z, y)) == pytest.approx(float(plain.forward(z, y)), rel=1e-14)
        np.testing.assert_allclose(ones.backward(), plain.backward(), rtol=1e-14)
        assert float(threes.forward(z, y)) == pytest.approx(3 * float(plain.forward(z, y)), rel=1e-14)


def test_binary_soft_targets_weigh_in_between():
    """A target y in [0, 1] weighs w0 + (w1 − w0)·y: 0.25 with [0.3, 2.0] counts 0.725 times."""
    z, y = np.array([[0.7], [-1.2]]), np.array([0.25, 1.0])
    weighted = registry.losses.build({"type": "BinaryCrossEntropy", "class_weights": [0.3, 2.0]})
    plain = registry.losses.build("BinaryCrossEntropy")
    per = [float(plain.forward(z[i:i + 1], y[i:i + 1])) for i in range(2)]
    assert float(weighted.forward(z, y)) == pytest.approx((0.725 * per[0] + 2.0 * per[1]) / 2, rel=1e-14)


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_softmax_cross_entropy_gpu_path_weights_like_the_cpu_path(smoothing, monkeypatch):
    z, y = Z.astype(np.float32), LABELS
    spec = {"type": "SoftmaxCrossEntropy", "class_weights": W4, "label_smoothing": smoothing}

    def run():
        loss = registry.losses.build(spec)
        return loss.forward(z, y), loss.backward().copy()

    cpu = run()
    with emulate(monkeypatch) as calls:
        gpu = run()
    assert calls["dlrun_sce_grad"] == 1 and np.asarray(gpu[0]).dtype == np.float32
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-6)
    np.testing.assert_allclose(gpu[1], cpu[1], rtol=1e-6, atol=1e-8)


def test_pytorch_agrees():
    """torch's per-sample losses (reduction='none') times w[y], averaged over N: Keras'
    class_weight. (torch's own weight= divides by Σ w[y_i] instead; MultiMarginLoss by C too.)"""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for case, (spec, z, y) in CASES.items():
        zt, yt = torch.tensor(z, requires_grad=True), torch.tensor(y)
        w = torch.tensor(sample_weights(spec, y))
        if case.startswith("SoftmaxCrossEntropy"):
            per = F.cross_entropy(zt, yt, reduction="none", label_smoothing=spec.get("label_smoothing", 0.0))
        elif case == "NLL":
            per = F.nll_loss(zt, yt, reduction="none")
        elif case == "Hinge":
            per = F.multi_margin_loss(zt, yt, margin=spec["margin"], reduction="none") * z.shape[1]
        else:
            per = F.binary_cross_entropy_with_logits(zt[:, 0], yt.double(), reduction="none")
        want = (per * w).mean()
        want.backward()
        loss = registry.losses.build(spec)
        assert float(loss.forward(z, y)) == pytest.approx(want.item(), rel=1e-13), case
        np.testing.assert_allclose(loss.backward(), zt.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=case)


def test_bad_weights_are_config_errors_that_say_what_and_where():
    with pytest.raises(ConfigError, match=r"^loss.class_weights: item \[1\]: expected a number >= 0, got -2$"):
        registry.losses.build({"type": "SoftmaxCrossEntropy", "class_weights": [1, -2]}, "loss")
    with pytest.raises(ConfigError, match=r"at least one weight above 0, got \[0.0, 0.0\]"):
        registry.losses.build({"type": "NLL", "class_weights": [0, 0]}, "loss")
    with pytest.raises(ConfigError, match="did you mean class_weights"):
        registry.losses.build({"type": "Hinge", "class_weight": [1, 2]}, "loss")
    assert "class_weights" not in [o.name for o in registry.losses.options("MSE")]  # regression: no classes
    assert repr(registry.losses.build({"type": "NLL", "class_weights": [1, 2]})) == "NLL(class_weights=[1.0, 2.0])"
    # the Trainer API checks the count too, before the first batch
    model = Sequential([registry.layers.build({"type": "Linear", "units": 1})], (3,))
    trainer = Trainer(model, registry.losses.build({"type": "BinaryCrossEntropy", "class_weights": [1, 2, 3]}),
                      registry.optimizers.build("SGD"))
    with pytest.raises(ConfigError, match=r"^loss.class_weights: 3 weights, but BinaryCrossEntropy scores 2 classes"):
        trainer.fit(np.zeros((4, 3), np.float32), np.array([0, 1, 0, 1]), epochs=1)


CONFIG = """
name: weighted
seed: 0
data: {type: blobs, samples: 120, classes: 3, features: 2, std: 4.0}
model:
  - {type: Linear, units: 8}
  - ReLU
  - {type: Linear, units: 3}
loss: {type: SoftmaxCrossEntropy, class_weights: WEIGHTS}
optimizer: {type: SGD, learning_rate: LR}
train: {epochs: 3, batch_size: 32, validation_split: 0.25}
"""


def test_training_and_validation_use_the_weights(tmp_path):
    """Every weight 3 with a third of the learning rate takes the same SGD steps as weights 1, so
    every train_loss and val_loss is three times as large; a wrong count of weights is exit 2."""
    rows = []
    for name, weights, lr in (("one", "[1, 1, 1]", 0.09), ("three", "[3, 3, 3]", 0.03)):
        cfg = write(tmp_path / f"{name}.yaml", CONFIG.replace("WEIGHTS", weights).replace("LR", str(lr)))
        rows.append(metrics_rows(train(cfg, tmp_path / "runs")))
    assert len(rows[0]) == len(rows[1]) == 3
    for one, three in zip(*rows):
        for key in ("train_loss", "val_loss"):
            assert float(three[key]) == pytest.approx(3 * float(one[key]), rel=1e-4), (key, one, three)
        assert one["val_accuracy"] == three["val_accuracy"]
    bad = write(tmp_path / "bad.yaml", CONFIG.replace("WEIGHTS", "[1, 2]").replace("LR", "0.1"))
    r = run_cli("train", bad, "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and "bad.yaml:9: loss.class_weights: 2 weights, but the model scores 3 classes: give one weight per class" in r.err, r.err
    assert "Traceback" not in r.err


def test_gradcheck_checks_weighted_losses_and_models(tmp_path):
    for name, weights in (("SoftmaxCrossEntropy", "[1,2,0,3]"), ("NLL", "[1,2,0]"), ("Hinge", "[0.5,2,1,3,1]"),
                          ("BinaryCrossEntropy", "[0.2,3]")):
        r = run_cli("gradcheck", name, "--set", f"class_weights={weights}")
        assert r.code == 0 and f"RESULT {name}: PASS" in r.out, r.out + r.err
    # as many classes as weights: C follows them, and a C given that differs is a usage error
    r = run_cli("gradcheck", "NLL", "--set", "class_weights=[1,2,0]", "--dims", "N=5,C=4")
    assert r.code == 2 and "--dims C=4, but the loss has 3 class_weights" in r.err, r.err
    cfg = write(tmp_path / "w.yaml", CONFIG.replace("WEIGHTS", "[1, 4, 0.5]").replace("LR", "0.1"))
    r = run_cli("gradcheck", cfg)
    assert r.code == 0, r.out + r.err
