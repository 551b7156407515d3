"""`dlrun time`: the real command on a shipped config (structure and positivity, no thresholds)."""
from __future__ import annotations

import re

from dlrun.config import load_config
from dlrun.commands.timing import time_config
from conftest import CONFIGS


def _row(out: str, label: str) -> list[str]:
    line = next(l for l in out.splitlines() if label in l)
    return [c.strip() for c in line.strip("│┃ ").split("│")]


def test_time_prints_every_layer_loss_optimizer_and_total(cli):
    r = cli("time", CONFIGS / "spiral.yaml", "--batches", "3", "--set", "train.batch_size=64")
    assert r.code == 0, r.err
    assert "median over 3 batches of 64 on cpu" in r.out
    for i, name in enumerate(["Linear", "ReLU", "Linear"]):
        cells = _row(r.out, f"{i} {name}")
        assert float(cells[2]) > 0 and float(cells[4]) > 0  # forward, total
    assert float(_row(r.out, "2 Linear")[3]) > 0  # backward
    assert float(_row(r.out, "loss SoftmaxCrossEntropy")[4]) > 0
    assert float(_row(r.out, "optimizer step")[4]) > 0
    assert float(_row(r.out, "whole step")[4]) > 0
    shares = [float(m) for m in re.findall(r"(\d+\.\d)%", r.out)]
    assert abs(sum(shares[:-1]) - 100) < 1.0 and shares[-1] == 100.0


def test_time_marks_skipped_backward_of_leading_parameterless_layers(cli):
    r = cli("time", CONFIGS / "spiral.yaml", "--batches", "2", "--set", "model[0]=ReLU")
    assert r.code == 0, r.err
    assert _row(r.out, "0 ReLU")[3] == "-" and _row(r.out, "1 ReLU")[3] == "-"
    assert float(_row(r.out, "2 Linear")[3]) > 0


def test_time_rejects_zero_batches(cli):
    r = cli("time", CONFIGS / "spiral.yaml", "--batches", "0")
    assert r.code == 2 and "--batches must be at least 1, got 0" in r.err


def test_time_config_returns_data():
    rep = time_config(load_config(CONFIGS / "spiral.yaml", ["train.batch_size=100"]), batches=2)
    assert [p.name for p in rep.layers] == ["0 Linear", "1 ReLU", "2 Linear"]
    assert rep.batch_size == 100 and rep.device == "cpu"
    assert all(p.forward > 0 and p.backward > 0 for p in rep.layers)
    assert rep.optimizer > 0 and rep.step >= rep.optimizer and rep.parts_total > 0


def test_time_lists_layers_in_execution_order_and_says_so(cli):
    """digits_cnn has Conv2D, ReLU, MaxPool2D twice: each ReLU runs (and is timed) after its pool."""
    r = cli("time", CONFIGS / "digits_cnn.yaml", "--batches", "2")
    assert r.code == 0, r.err
    names = [l.strip("│┃ ").split("│")[0].strip() for l in r.out.splitlines() if "│ " in l]
    assert names[:6] == ["0 Conv2D", "2 MaxPool2D", "1 ReLU", "3 Conv2D", "5 MaxPool2D", "4 ReLU"]
    assert _row(r.out, "1 ReLU")[1] == "(N, 32, 4, 4)"  # the pooled map
    assert "model[1] after model[2], model[4] after model[5]" in " ".join(r.out.split())


SPIKE = '''
import numpy as np
from dlrun.losses import Loss
from dlrun.registry import losses


@losses.register()
class SpikyMSE(Loss):
    """MSE into a reused 0-d buffer, inf on its third call (a transient overflow)."""

    task = "regression"

    def __init__(self):
        self.calls, self.out = 0, np.zeros((), np.float32)

    def forward(self, z, y):
        self.calls += 1
        self.d = z - y.reshape(z.shape)
        self.out[...] = np.inf if self.calls == 3 else (self.d ** 2).mean()
        return self.out

    def backward(self):
        return self.d * (2.0 / self.d.size)
'''


def test_time_notes_a_non_finite_loss_even_from_a_reused_buffer(cli, tmp_path):
    """The losses were kept and read after the timing: a loss that returns one 0-d buffer left only
    its last (finite) value, and the note was missed."""
    (tmp_path / "spiky.py").write_text(SPIKE)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("plugins: [spiky.py]\ndata: {type: sine, samples: 64}\nmodel: [{type: Linear, units: 8}, Tanh, "
                   "{type: Linear, units: 1}]\nloss: SpikyMSE\noptimizer: SGD\ntrain: {batch_size: 16}\n")
    r = cli("time", cfg, "--batches", "4")
    assert r.code == 0, r.err
    assert "the loss became NaN or inf during these steps" in r.out, r.out


def test_time_shows_what_train_metrics_cost_per_batch():
    """train.metrics add their sums after every batch's loss: a part of the step, timed as one."""
    plain = time_config(load_config(CONFIGS / "spiral.yaml", ["train.batch_size=64"]), batches=3)
    assert plain.metrics is None
    r = time_config(load_config(CONFIGS / "spiral.yaml", ["train.batch_size=64",
                                                            "train.metrics=[f1, {type: top_k_accuracy, k: 2}]"]), 3)
    assert r.metrics.name == "metrics f1, top_k_accuracy" and r.metrics.forward > 0 and r.metrics.backward is None
    assert r.parts_total == sum(p.total for p in r.layers) + r.loss.total + r.optimizer + r.metrics.forward
