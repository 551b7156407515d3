"""Helpers of the resume and interrupt tests: a stochastic plugin layer and its configs, a callback
that interrupts a run at a chosen batch, and bit-for-bit comparisons of checkpoints."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, summary
from conftest import write
from dlrun import registry
from dlrun.config import load_config
from dlrun.errors import Interrupted
from dlrun.runs import checkpoint, run
from dlrun.training.hooks import Callback


# A stochastic plugin layer: its noise comes from self.rng, so a resume that did not restore
# the layer's generator state would diverge from the straight run.
NOISE = '''
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class TestNoise(Layer):
    """y = x + 0.1·ε with ε ~ N(0, 1) in training; y = x in evaluation."""

    has_phase = True
    stochastic = True

    def forward(self, x, y=None):
        if not self.training:
            return x
        return x + (0.1 * self.rng.standard_normal(x.shape)).astype(x.dtype)

    def backward(self, dy):
        return dy
'''


NOISY = """\
name: noisy
seed: 5
plugins: [noise_plugin.py]
data: {type: spiral, classes: 3, points_per_class: 30, noise: 0.2, seed: 2}
model:
  - {type: Linear, units: 12, weight_initializer: he_normal}
  - TestNoise
  - ReLU
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.3, momentum: 0.9}
train: {epochs: EPOCHS, batch_size: 16, shuffle: true, validation_split: 0.2}
"""


def _arrays(path):
    ckpt = checkpoint.read(path)
    return ckpt.model, ckpt.optimizer, ckpt.meta


def _assert_same_state(a, b):
    ma, oa, meta_a = _arrays(a)
    mb, ob, meta_b = _arrays(b)
    assert ma.keys() == mb.keys() and oa.keys() == ob.keys()
    for k in ma:
        assert np.array_equal(ma[k], mb[k]), k
    for k in oa:
        assert np.array_equal(oa[k], ob[k]), k
    assert (meta_a["epoch"], meta_a["step"]) == (meta_b["epoch"], meta_b["step"])
    assert meta_a["rng"] == meta_b["rng"]


@pytest.fixture(autouse=True)
def _forget_noise_plugin():
    """Each test loads TestNoise from its own folder: the registry takes one origin per name."""
    yield
    registry.layers.unregister("TestNoise")


class InterruptAt(Callback):
    """Sends this process SIGINT at the end of batch ``batch`` of ``epoch`` (-1: the last batch),
    after ``before(trainer)`` (to spoil the state, say)."""

    def __init__(self, epoch, batch, before=None):
        self.at, self.before = (epoch, batch), before

    def on_train_begin(self, trainer):
        self.trainer = trainer

    def on_epoch_begin(self, epoch, batches):
        self.batches = batches

    def on_batch_end(self, epoch, batch):
        if (epoch, batch if self.at[1] > 0 else batch - self.batches - 1) == self.at:
            if self.before:
                self.before(self.trainer)
            os.kill(os.getpid(), signal.SIGINT)


def _interrupted(cfg, runs, *stops):
    """Train ``cfg`` and interrupt it at each of ``stops`` in turn, resuming in between; returns
    the run directory and the checkpoint metadata saved at each stop."""
    metas, resumed = [], None
    for at in stops:
        with pytest.raises(Interrupted) as e:
            if resumed is None:
                run.train(load_config(cfg), runs, callbacks=[at])
            else:
                run.resume(resumed, *run.resume_config(resumed), callbacks=[at])
        assert e.value.exit_code == 130 and "resume with: dlrun train --resume" in e.value.message
        (resumed,) = runs.iterdir()
        metas.append(checkpoint.read(resumed / "checkpoints" / "last.npz").meta)
    return resumed, metas


def _config_and_straight_run(tmp_path, text):
    """The config (NOISE plugin beside it) and the run directory of its uninterrupted training."""
    write(tmp_path / "noise_plugin.py", NOISE)
    cfg = write(tmp_path / "cfg.yaml", text)
    return cfg, run.train(load_config(cfg), tmp_path / "a").run_dir


def _same_run(straight, resumed):
    _assert_same_state(straight / "checkpoints" / "last.npz", resumed / "checkpoints" / "last.npz")
    _assert_same_state(straight / "checkpoints" / "best.npz", resumed / "checkpoints" / "best.npz")
    assert metrics_rows(straight) == metrics_rows(resumed)
    for k in ("train_loss", "val_loss", "final_train_loss", "best"):
        assert summary(straight)[k] == summary(resumed)[k], k


def _resume_equals(straight, resumed):
    """Resume ``resumed`` to its end: it must equal the uninterrupted run, bit for bit."""
    run.resume(resumed, *run.resume_config(resumed))
    _same_run(straight, resumed)


# NOISY with a per-step schedule, gradient clipping and drop_last (72 samples at batch 16: 4 steps)
PER_STEP = NOISY.replace("train: {epochs: EPOCHS, batch_size: 16, shuffle: true, validation_split: 0.2}\n", """\
train:
  epochs: EPOCHS
  batch_size: 16
  validation_split: 0.2
  drop_last: true
  clip_norm: 0.5
  schedule: {type: warmup, epochs: 1, then: {type: cosine, period: 5}}
  schedule_interval: step
""")
