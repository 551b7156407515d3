"""End to end through `python -m dlrun`: schedules in metrics.csv, early stopping, clipping,
the new losses, and the shipped configs."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import CONFIGS, write
from dlrun import run
from dlrun.config import load_config

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

BASE = """\
seed: 0
data: {type: blobs, samples: 120, classes: 3}
model:
  - {type: Linear, units: 16}
  - ReLU
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.5, momentum: 0.5}
train:
  epochs: 6
  batch_size: 32
  validation_split: 0.25
"""


def train(cli, tmp_path, text, *args):
    cfg = write(tmp_path / "run.yaml", text)
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs", *args, env=ONE_THREAD)
    assert r.code == 0, r.err
    run_dir = Path(r.out.strip().splitlines()[-1])
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    return rows, json.loads((run_dir / "summary.json").read_text())


def test_schedule_shows_in_metrics_csv(cli, tmp_path):
    rows, _ = train(cli, tmp_path, BASE + "  schedule: {type: step, step_size: 2, gamma: 0.5}\n")
    assert [float(r["learning_rate"]) for r in rows] == [0.5, 0.5, 0.25, 0.25, 0.125, 0.125]


def test_warmup_then_cosine_from_the_command_line(cli, tmp_path):
    rows, _ = train(cli, tmp_path, BASE, "--set", "train.schedule={type: warmup, epochs: 2, then: cosine}",
                    "--set", "train.clip_norm=1.0")
    want = [0.25, 0.5] + [0.25 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert [float(r["learning_rate"]) for r in rows] == pytest.approx(want, rel=1e-12)


def test_early_stopping_stops_the_run(cli, tmp_path):
    # min_delta larger than any possible change: no epoch after the first improves -> stop at 1 + patience
    rows, summary = train(cli, tmp_path, BASE + "  early_stopping: {monitor: val_loss, patience: 2, min_delta: 100}\n")
    assert len(rows) == 3 and summary["epochs"] == 3


def test_bad_schedule_is_one_line_with_location(cli, tmp_path):
    cfg = write(tmp_path / "run.yaml", BASE + "  schedule: {type: cosin}\n")
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 2
    assert "run.yaml:13: train.schedule.type: unknown schedule 'cosin' (did you mean cosine?)" in r.err
    assert "Traceback" not in r.err and not (tmp_path / "runs").exists()


def test_list_and_show_schedules(cli):
    r = cli("list", "schedules")
    assert r.code == 0 and all(n in r.out for n in ("cosine", "warmup", "reduce_on_plateau", "step"))
    r = cli("show", "warmup")
    assert r.code == 0 and "start_factor" in r.out and "then" in r.out


def test_binary_cross_entropy_on_moons(cli, tmp_path):
    text = """\
seed: 0
data: {type: moons, samples: 300, noise: 0.1}
model:
  - {type: Linear, units: 32}
  - Tanh
  - {type: Linear, units: 1}
loss: BinaryCrossEntropy
optimizer: {type: Adam, learning_rate: 0.02}
train: {epochs: 40, validation_split: 0.2}
"""
    rows, summary = train(cli, tmp_path, text)
    assert summary["val_accuracy"] >= 0.95  # accuracy scored from one logit by loss.predict
    r = cli("train", write(tmp_path / "bad.yaml", text.replace("units: 1}", "units: 2}")), "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and "takes one logit per sample" in r.err


def test_iris_config(cli, tmp_path):
    r = cli("train", CONFIGS / "iris.yaml", "--runs-dir", tmp_path, env=ONE_THREAD)
    assert r.code == 0, r.err
    summary = json.loads((Path(r.out.strip().splitlines()[-1]) / "summary.json").read_text())
    assert summary["val_accuracy"] >= 0.85 and summary["train_accuracy"] >= 0.95


@pytest.mark.slow
def test_digits_mlp_config(cli, tmp_path):
    r = cli("train", CONFIGS / "digits_mlp.yaml", "--runs-dir", tmp_path, env=ONE_THREAD)
    assert r.code == 0, r.err
    summary = json.loads((Path(r.out.strip().splitlines()[-1]) / "summary.json").read_text())
    assert summary["val_accuracy"] >= 0.95


def test_regression_sine_config(cli, tmp_path):
    r = cli("train", CONFIGS / "regression_sine.yaml", "--runs-dir", tmp_path, env=ONE_THREAD)
    assert r.code == 0, r.err
    run_dir = Path(r.out.strip().splitlines()[-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["val_loss"] < 0.03 and summary["train_accuracy"] is None  # noise variance is 0.01
    r = cli("train", CONFIGS / "regression_sine.yaml", "--runs-dir", tmp_path, "--set", "loss={type: Huber, delta: 0.5}",
            "--set", "train.epochs=60", env=ONE_THREAD)
    assert r.code == 0, r.err


def test_moons_dropout_config_end_to_end(tmp_path):
    """The shipped config as it is: dropout, AdamW, warm-up then cosine, clipping, early stopping."""
    cfg = load_config(CONFIGS / "moons_dropout.yaml", ["train.epochs=30"])
    result = run.train(cfg, tmp_path)
    rows = result.history.rows
    assert result.summary["val_accuracy"] >= 0.9
    # warm-up 5 epochs to 0.01, then cosine to 1e-4 over the remaining 25
    want = [0.01 * e / 5 for e in range(1, 6)] + [1e-4 + (0.01 - 1e-4) * 0.5 * (1 + math.cos(math.pi * k / 25))
                                                 for k in range(25)]
    assert [r["learning_rate"] for r in rows] == pytest.approx(want[:len(rows)], rel=1e-12)
    # dropout is active in training only: the same weights score differently in the two phases
    model = result.trainer.model
    x = result.trainer.backend.asarray(np.random.default_rng(0).standard_normal((64, 2)), dtype=model.dtype)
    assert not np.array_equal(model.train().forward(x), model.eval().forward(x))
