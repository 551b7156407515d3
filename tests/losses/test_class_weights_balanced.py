"""class_weights: balanced — w_k = n / (C·n_k) from the training labels, recorded in the run."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from checkpoint_helpers import metrics_rows, train
from conftest import run_cli, write

from dlrun.runs import checkpoint
from dlrun import registry
from dlrun.errors import ConfigError
from dlrun.model import Sequential
from dlrun.training.trainer import Trainer


def build(name, **options):
    return registry.losses.build({"type": name, **options}, "loss")


def test_balanced_weights_are_n_over_classes_times_count():
    loss = build("SoftmaxCrossEntropy", class_weights="balanced")
    assert repr(loss) == "SoftmaxCrossEntropy(class_weights=balanced)"
    y = np.array([0] * 6 + [1] * 3 + [2])
    assert loss.balance(y, 3) is None
    assert loss.class_weights == pytest.approx((10 / 18, 10 / 9, 10 / 3), rel=1e-15)
    # every class then weighs n / C in total
    assert np.bincount(y) * np.array(loss.class_weights) == pytest.approx([10 / 3] * 3, rel=1e-15)
    hinge = build("Hinge", class_weights="balanced")
    assert hinge.balance(np.array([1, 1, 0, 2]), 3) is None and hinge.class_weights == pytest.approx((4 / 3, 2 / 3, 4 / 3))
    # a soft target y counts y towards class 1 and 1 - y towards class 0: n0 = 3.5, n1 = 1.5
    bce = build("BinaryCrossEntropy", class_weights="balanced")
    assert bce.balance(np.array([0, 0, 0, 1, 0.5]), 1) is None
    assert bce.class_weights == pytest.approx((5 / 7, 5 / 3), rel=1e-15)


def test_a_class_without_samples_and_an_unresolved_loss_are_errors():
    loss = build("NLL", class_weights="balanced")
    assert "class 2 has no training samples" in loss.balance(np.array([0, 1, 3, 1]), 4)
    assert loss.class_weights == "balanced"  # unchanged
    with pytest.raises(ConfigError, match="balanced is computed from the training labels when training starts"):
        loss.forward(np.zeros((2, 4)), np.array([0, 1]))
    with pytest.raises(ConfigError, match=r"got 'Balanced' \(did you mean balanced\?\)"):
        build("Hinge", class_weights="Balanced")


def test_the_trainer_computes_them_from_the_labels_it_fits():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3)).astype(np.float32), np.array([0, 0, 0, 0, 0, 0, 1, 1])
    loss = build("BinaryCrossEntropy", class_weights="balanced")
    trainer = Trainer(Sequential([registry.layers.build({"type": "Linear", "units": 1})], (3,)), loss,
                      registry.optimizers.build("SGD"))
    with pytest.raises(ConfigError, match="train first, or give the weights as a list"):
        trainer.evaluate(x, y)
    trainer.fit(x, y, epochs=1)
    assert loss.class_weights == pytest.approx((8 / 12, 8 / 4))


CONFIG = """
name: NAME
seed: 4
data: {type: file, path: imbalanced.npz}
model:
  - {type: Linear, units: 8}
  - ReLU
  - {type: Linear, units: 3}
loss: {type: SoftmaxCrossEntropy, class_weights: WEIGHTS}
optimizer: {type: SGD, learning_rate: 0.2}
train: {epochs: 3, batch_size: 16, validation_split: 0.2}
"""


def imbalanced(tmp_path, counts=(80, 15, 5)):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(1.5 * k, 1.0, (n, 2)) for k, n in enumerate(counts)]).astype(np.float32)
    y = np.concatenate([np.full(n, k) for k, n in enumerate(counts)])
    np.savez(tmp_path / "imbalanced.npz", x=x, y=y)


def test_a_run_records_the_weights_it_trained_with(tmp_path):
    imbalanced(tmp_path)
    cfg = write(tmp_path / "bal.yaml", CONFIG.replace("NAME", "bal").replace("WEIGHTS", "balanced"))
    run = train(cfg, tmp_path / "runs")
    # the stratified 20% split leaves 64, 12 and 4 training samples: 80 / (3·n_k)
    expected = [80 / (3 * 64), 80 / (3 * 12), 80 / (3 * 4)]
    saved = yaml.safe_load((run / "config.yaml").read_text())["loss"]["class_weights"]
    assert saved == pytest.approx(expected, rel=1e-15)
    meta = checkpoint.load(run / "checkpoints" / "last.npz")[2]
    assert meta["config"]["loss"]["class_weights"] == pytest.approx(expected, rel=1e-15)
    # training with the same weights as a list is the same run
    listed = write(tmp_path / "listed.yaml", CONFIG.replace("NAME", "listed").replace("WEIGHTS", repr(saved)))
    assert metrics_rows(train(listed, tmp_path / "runs")) == metrics_rows(run)
    # evaluate on other data keeps the trained weights (the checkpoint holds no "balanced")
    np.savez(tmp_path / "other.npz", x=np.zeros((3, 2), np.float32), y=np.array([0, 1, 2]))
    r = run_cli("evaluate", run, "--data", tmp_path / "other.npz")
    assert r.code == 0, r.err


def test_a_class_missing_from_the_training_labels_stops_the_run_before_any_file(tmp_path):
    imbalanced(tmp_path, counts=(50, 30, 0))
    cfg = write(tmp_path / "bal.yaml", CONFIG.replace("NAME", "bal").replace("WEIGHTS", "balanced"))
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and "bal.yaml:9: loss.class_weights: balanced: class 2 has no training samples" in r.err, r.err
    assert "Traceback" not in r.err and not (tmp_path / "runs").exists()


def test_gradcheck_computes_them_for_a_config_and_asks_for_a_list_for_a_loss(tmp_path):
    imbalanced(tmp_path)
    cfg = write(tmp_path / "bal.yaml", CONFIG.replace("NAME", "bal").replace("WEIGHTS", "balanced"))
    r = run_cli("gradcheck", cfg)
    assert r.code == 0 and "RESULT loss SoftmaxCrossEntropy: PASS" in r.out, r.out + r.err
    r = run_cli("gradcheck", "SoftmaxCrossEntropy", "--set", "class_weights=balanced")
    assert r.code == 2 and "a loss check has none: give the weights" in r.err, r.err
