"""benchmarks/bench_jax.py: the JAX column of the CPU benchmark trains what dlrun and torch train.

Same initial weights, data, batch order and optimizer: the final losses agree within float32
rounding (the sides sum in different orders). Without JAX the column says so instead of failing.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

import bench_dlrun  # noqa: E402
import bench_jax  # noqa: E402
import workloads  # noqa: E402

CNN = """
seed: 3
data: {type: digits}
model:
  - {type: Conv2D, filters: 4, kernel_size: 3, padding: same}
  - ReLU
  - {type: MaxPool2D, pool_size: 2}
  - Flatten
  - {type: Linear, units: 16}
  - ReLU
  - {type: Linear, units: 10}
loss: SoftmaxCrossEntropy
optimizer: {type: Adam, learning_rate: 0.01}
regularizer: {type: L2, strength: 1.0e-3}
train: {epochs: 2, batch_size: 100}
"""


def final_losses(w: workloads.Workload) -> tuple[float, float]:
    """(dlrun's, JAX's) final loss on ``w``, without the penalty dlrun adds to its reported loss."""
    jax_run = bench_jax.prepare(w)
    trainer, x, y, epochs, _ = bench_dlrun.build(w)
    hist = trainer.fit(x, y, epochs=epochs)
    return hist.last["train_loss"] - trainer.training_step.penalty(), jax_run()[2]


@pytest.mark.skipif(bench_jax.jax is None, reason="JAX is not installed (the jax extra)")
def test_jax_trains_the_spiral_to_dlruns_and_the_hand_written_loops_loss():
    import bench_numpy

    w = dataclasses.replace(workloads.WORKLOADS["spiral"], epochs=200)
    dl, jx = final_losses(w)
    floor = bench_numpy.prepare(w)()[2]
    assert jx == pytest.approx(dl, rel=1e-4) and jx == pytest.approx(floor, rel=1e-4)
    assert dl < 0.2  # it trained: the comparison is not between two untouched starts


@pytest.mark.skipif(bench_jax.jax is None, reason="JAX is not installed (the jax extra)")
def test_jax_matches_dlrun_with_convolutions_adam_l2_and_a_partial_last_batch(tmp_path):
    cfg = tmp_path / "cnn.yaml"
    cfg.write_text(CNN)
    w = workloads.Workload("cnn_adam", "a small CNN", config=str(cfg))
    dl, jx = final_losses(w)  # 1,797 digits in batches of 100: the last one has 97
    assert jx == pytest.approx(dl, rel=1e-4)
    assert dl < 1.5


def test_without_jax_the_column_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(bench_jax, "jax", None)
    with pytest.raises(bench_jax.Unsupported, match=r"JAX is not installed \(pip install -e '\.\[jax\]'\)"):
        bench_jax.prepare(workloads.WORKLOADS["spiral"])


@pytest.mark.skipif(bench_jax.jax is None, reason="JAX is not installed (the jax extra)")
def test_a_layer_jax_has_no_translation_for_is_named():
    with pytest.raises(bench_jax.Unsupported, match="no JAX translation of dlrun layer LSTM"):
        bench_jax.prepare(workloads.WORKLOADS["lstm"])
