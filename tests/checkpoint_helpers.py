"""Small configs and readers shared by the checkpoint, resume, predict and evaluate tests."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from conftest import run_cli, write

SPIRAL = """\
name: {name}
seed: 3
data: {{type: spiral, classes: 3, points_per_class: 40, noise: 0.2, seed: 1}}
model:
  - {{type: Linear, units: 16, weight_initializer: he_normal}}
  - ReLU
  - {{type: Linear, units: 3}}
loss: SoftmaxCrossEntropy
optimizer: {{type: SGD, learning_rate: {lr}, momentum: {momentum}}}
train: {{epochs: {epochs}, batch_size: {batch_size}, shuffle: {shuffle}, validation_split: {split}}}
"""


def spiral_config(tmp: Path, name="spiral", lr=0.5, momentum=0.9, epochs=10, batch_size=16, shuffle="true",
                  split=0.25, extra="") -> Path:
    return write(tmp / f"{name}.yaml", SPIRAL.format(name=name, lr=lr, momentum=momentum, epochs=epochs,
                                                     batch_size=batch_size, shuffle=shuffle, split=split) + extra)


def train(config: Path, runs: Path, *args) -> Path:
    """Run `dlrun train` and return the run directory it printed."""
    r = run_cli("train", config, "--runs-dir", runs, *args)
    assert r.code == 0, r.err
    return Path(r.out.strip().splitlines()[-1])


def metrics_rows(run_dir: Path) -> list[dict]:
    """metrics.csv without the wall-clock column."""
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def read_csv(text: str) -> tuple[list[str], np.ndarray]:
    rows = list(csv.reader(text.splitlines()))
    return rows[0], np.array([[float(c) for c in r] for r in rows[1:]])
