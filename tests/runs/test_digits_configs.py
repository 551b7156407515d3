"""End to end: the shipped digits configs train through the real `dlrun train` command."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import CONFIGS


def _train(cli, config, tmp_path, *sets):
    args = ["train", CONFIGS / config, "--runs-dir", tmp_path]
    for s in sets:
        args += ["--set", s]
    r = cli(*args)
    assert r.code == 0, r.err + r.out
    run_dir = Path(r.out.strip().splitlines()[-1])
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return rows, json.loads((run_dir / "summary.json").read_text())


def test_digits_cnn_loss_falls_in_a_brief_run(cli, tmp_path):
    rows, _ = _train(cli, "digits_cnn.yaml", tmp_path, "train.epochs=3")
    losses = [float(r["train_loss"]) for r in rows]
    assert len(losses) == 3
    assert losses[2] < losses[1] < losses[0]
    assert losses[2] < 0.6 * losses[0]
    assert float(rows[-1]["val_accuracy"]) > 0.8  # well above the 0.1 of chance after 3 epochs


@pytest.mark.slow
def test_digits_cnn_reaches_097_validation_accuracy(cli, tmp_path):
    rows, summary = _train(cli, "digits_cnn.yaml", tmp_path)
    assert summary["val_accuracy"] >= 0.97, rows[-1]


@pytest.mark.slow
def test_digits_mlp_trains_on_flattened_images(cli, tmp_path):
    rows, summary = _train(cli, "digits_mlp.yaml", tmp_path)
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"]) / 5
    assert summary["val_accuracy"] >= 0.95, rows[-1]


def test_digits_resnet_is_a_graph_whose_loss_falls_in_a_brief_run(cli, tmp_path):
    rows, _ = _train(cli, "digits_resnet.yaml", tmp_path, "train.epochs=2", "train.validation_split=0.5")
    losses = [float(r["train_loss"]) for r in rows]
    assert losses[1] < losses[0] < 2.3  # (chance: ln 10)
    assert float(rows[-1]["val_accuracy"]) > 0.8


@pytest.mark.slow
def test_digits_resnet_reaches_098_validation_accuracy(cli, tmp_path):
    rows, summary = _train(cli, "digits_resnet.yaml", tmp_path)
    assert summary["val_accuracy"] >= 0.98, rows[-1]
