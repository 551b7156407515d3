"""train.accumulate_batches: one optimizer step per window of batches, on the size-weighted mean of
their gradients, equals training on batches that many times larger; interrupts wait for a
window's end, and --resume, schedules, clipping and the non-finite replay follow the steps."""
from __future__ import annotations

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, train
from conftest import write
from dlrun import registry
from dlrun.training.accumulate import windows
from dlrun.errors import NonFiniteError
from dlrun.model import Sequential
from dlrun.training.trainer import Trainer
from resume_helpers import PER_STEP, InterruptAt, _config_and_straight_run, _interrupted, _resume_equals
from resume_helpers import _forget_noise_plugin  # noqa: F401  (autouse: the TestNoise plugin is forgotten after each test)


def test_windows_split_an_epoch_into_steps_weighted_by_samples():
    # 10 batches of 8 (the last of 4 samples: 76 in all), 4 per step: 4+4+2 batches
    plan = windows(10, 8, 76, 4)
    assert [(f, last) for _, f, last in plan] == [(True, False), (False, False), (False, False), (False, True)] * 2 + [
        (True, False), (False, True)]
    assert [s for s, _, _ in plan[:4]] == [0.25] * 4 and [s for s, _, _ in plan[8:]] == [8 / 12, 4 / 12]
    # a resumed epoch after 6 batches: its first window runs to the next multiple of 4
    assert windows(10, 8, 76, 4, start=6) == [(0.5, True, False), (0.5, False, True), (8 / 12, True, False),
                                             (4 / 12, False, True)]
    assert windows(3, 8, 24, 5) == [(1 / 3, True, False), (1 / 3, False, False), (1 / 3, False, True)]


def _fit(batch_size, accumulate, optimizer, regularizer=None, clip=None, dtype=np.float64):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((100, 3)), rng.integers(0, 3, 100)
    model = Sequential([registry.layers.build({"type": "Linear", "units": 8}), registry.layers.build("Tanh"),
                        registry.layers.build({"type": "Linear", "units": 3})], (3,), dtype=dtype, seed=1)
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build(optimizer),
                      registry.regularizers.build(regularizer) if regularizer else None, batch_size=batch_size,
                      accumulate=accumulate)
    callbacks = []
    if clip:
        from dlrun.training.controls import GradientClipping
        callbacks.append(GradientClipping(clip_norm=clip))
    history = trainer.fit(x, y, epochs=3, callbacks=callbacks)
    return model.arena.data.copy(), [r["train_loss"] for r in history.rows], trainer.step


@pytest.mark.parametrize("optimizer, regularizer, clip", [
    ({"type": "SGD", "learning_rate": 0.5, "momentum": 0.9}, None, None),
    ({"type": "Adam", "learning_rate": 0.05}, {"type": "L2", "strength": 0.01}, None),
    ({"type": "SGD", "learning_rate": 0.5}, None, 0.05),  # clipping acts on the accumulated gradient
], ids=["sgd-momentum", "adam-l2", "clip-norm"])
def test_accumulated_batches_train_as_one_batch_that_many_times_larger(optimizer, regularizer, clip):
    """100 samples: batches of 40 (40, 40, 20) against windows of 4 batches of 10 (the last of 2):
    the same steps, the same weights (float64), and the same epoch losses."""
    big = _fit(40, 1, optimizer, regularizer, clip)
    small = _fit(10, 4, optimizer, regularizer, clip)
    assert big[2] == small[2] == 9  # optimizer steps, not batches
    np.testing.assert_allclose(small[0], big[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(small[1], big[1], rtol=1e-12)
    plain = _fit(10, 1, optimizer, regularizer, clip)  # (and not what ten-sample steps reach)
    assert plain[2] == 30 and np.abs(plain[0] - big[0]).max() > 1e-3


def test_float32_stays_close_to_the_large_batch():
    big, small = _fit(40, 1, {"type": "Adam", "learning_rate": 0.05}, dtype=np.float32), \
        _fit(10, 4, {"type": "Adam", "learning_rate": 0.05}, dtype=np.float32)
    assert small[0].dtype == np.float32
    np.testing.assert_allclose(small[0], big[0], atol=1e-4)


CONFIG = """
name: acc
seed: 3
dtype: float64
data: {type: spiral, classes: 3, points_per_class: 32, noise: 0.2, seed: 1}
model:
  - {type: Linear, units: 16}
  - ReLU
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.5, momentum: 0.9}
train:
  epochs: 3
  shuffle: true
  validation_split: 0.25
  schedule: {type: warmup, epochs: 2, then: {type: cosine}}  # warmup reads a step's length
  schedule_interval: step
  BATCHING
"""


@pytest.mark.parametrize("big_batch,small_batch,every", [(24, 6, 4), (16, 8, 2)])
def test_config_option_trains_as_the_larger_batch_with_a_per_step_schedule(tmp_path, big_batch, small_batch, every):
    """72 training samples: batch_size 24 against 4 accumulated batches of 6, with a per-step
    warmup-then-cosine schedule (it counts optimizer steps: the learning_rate column must agree
    too); and 16 against 2 x 8, where the epoch's 9 batches make 5 steps, the last of one batch."""
    runs = []
    for name, batching in (("big", f"batch_size: {big_batch}"),
                           ("acc", f"batch_size: {small_batch}\n  accumulate_batches: {every}")):
        text = CONFIG.replace("BATCHING", batching)
        runs.append(metrics_rows(train(write(tmp_path / f"{name}.yaml", text), tmp_path / "runs")))
    big, acc = runs
    for a, b in zip(big, acc):
        for key in ("train_loss", "val_loss", "learning_rate", "train_accuracy"):
            assert float(b[key]) == pytest.approx(float(a[key]), rel=1e-10, abs=1e-14), key


def test_bad_value_is_a_config_error(cli, tmp_path):
    cfg = write(tmp_path / "c.yaml", CONFIG.replace("  BATCHING", "  accumulate_batches: 0"))
    r = cli("check", cfg)
    assert r.code == 2 and "train.accumulate_batches: expected a positive integer, got 0" in r.err, r.err


@pytest.mark.slow
def test_an_interrupt_waits_for_the_window_and_resumes_exactly(tmp_path):
    """SIGINT after batch 2 of a window of 3 stops after batch 3, where a step was taken; the
    resumed run equals the uninterrupted one bit for bit (noise layer, clipping, per-step schedule)."""
    text = PER_STEP.replace("EPOCHS", "5").replace("batch_size: 16", "batch_size: 8\n  accumulate_batches: 3")
    cfg, straight = _config_and_straight_run(tmp_path, text)
    resumed, (meta,) = _interrupted(cfg, tmp_path / "b", InterruptAt(3, 2))
    assert meta["position"]["batches_done"] == 3 and meta["interrupted"]["batches_done"] == 3
    assert meta["step"] == 2 * 3 + 1  # 9 batches an epoch (drop_last): 3 steps, and one of epoch 3
    _resume_equals(straight, resumed)


def test_the_non_finite_replay_names_the_batch_that_failed():
    """A learning rate that overflows: the replay steps where training stepped (after each window)."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 3)) * 100, rng.integers(0, 3, 64)
    model = Sequential([registry.layers.build({"type": "Linear", "units": 4}), registry.layers.build("ReLU"),
                        registry.layers.build({"type": "Linear", "units": 3})], (3,), seed=1)
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"),
                      registry.optimizers.build({"type": "SGD", "learning_rate": 1e38}), batch_size=8, accumulate=2)
    with pytest.raises(NonFiniteError) as e, np.errstate(all="ignore"):  # (the overflow is the point)
        trainer.fit(x, y, epochs=2)
    assert "epoch 1, batch 2:" in e.value.message, e.value.message  # the first step, after batch 2
