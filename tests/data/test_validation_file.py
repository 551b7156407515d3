"""data: {type: file, validation_path: ...}: validation samples from their own file (Keras'
validation_data), with errors that name that file and its lines."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from conftest import write
from dlrun.config import load_config
from dlrun.errors import DataError
from dlrun.data import load_data

CONFIG = """\
data: {type: file, path: train.csv, validation_path: %s}
model:
  - {type: Linear, units: 8}
  - Tanh
  - {type: Linear, units: 2}
loss: SoftmaxCrossEntropy
optimizer: {type: Adam, learning_rate: 0.05}
train: {epochs: 3, batch_size: 20}
"""


def _csv(path, n, seed, columns=2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, columns))
    y = (x[:, 0] > 0).astype(int)
    write(path, "a,b" + ",c" * (columns - 2) + ",label\n" + "".join(
        ",".join(f"{v:.4f}" for v in row) + f",{label}\n" for row, label in zip(x, y)))
    return x, y


def test_the_validation_file_is_the_validation_data(tmp_path, cli):
    x, y = _csv(tmp_path / "train.csv", 60, 0)
    xv, yv = _csv(tmp_path / "val.csv", 25, 1)
    cfg = write(tmp_path / "c.yaml", CONFIG % "val.csv")
    ds = load_data(load_config(cfg))
    np.testing.assert_allclose(ds.x, np.round(x, 4)), np.testing.assert_array_equal(ds.y, y)
    np.testing.assert_allclose(ds.x_val, np.round(xv, 4)), np.testing.assert_array_equal(ds.y_val, yv)
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    run = next((tmp_path / "runs").iterdir())
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert len(rows) == 3 and all(row["val_loss"] for row in rows)
    assert "val_accuracy" in json.loads((run / "summary.json").read_text())
    # the recorded config names both files absolutely: evaluate works from any directory
    r = cli("evaluate", run, cwd=tmp_path.parent)
    assert r.code == 0, r.err
    assert f"validation data {tmp_path / 'val.csv'} (data.validation_path of the recorded config), 25 samples" in r.out


def test_a_bad_row_in_the_validation_file_names_that_file_and_line(tmp_path):
    _csv(tmp_path / "train.csv", 30, 0)
    _csv(tmp_path / "val.csv", 10, 1)
    lines = (tmp_path / "val.csv").read_text().splitlines()
    lines[4] = "0.1,oops,1"
    write(tmp_path / "val.csv", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"val\.csv:5: column 2: expected a number, got 'oops'"):
        load_data(load_config(write(tmp_path / "c.yaml", CONFIG % "val.csv")))


def test_a_validation_file_with_other_columns_is_refused(tmp_path):
    _csv(tmp_path / "train.csv", 30, 0)
    _csv(tmp_path / "val.csv", 10, 1, columns=3)
    with pytest.raises(DataError) as e:
        load_data(load_config(write(tmp_path / "c.yaml", CONFIG % "val.csv")))
    assert "val.csv: samples of shape (3,), but the training file" in str(e.value) and "shape (2,)" in str(e.value)
    assert "c.yaml:1: data.validation_path:" in str(e.value)  # the config key to change


def test_a_missing_validation_file_is_an_error_at_the_data_line(tmp_path):
    _csv(tmp_path / "train.csv", 30, 0)
    with pytest.raises(DataError) as e:
        load_data(load_config(write(tmp_path / "c.yaml", CONFIG % "nope.csv")))
    assert f"data file not found: {tmp_path / 'nope.csv'}" in str(e.value) and "c.yaml:1" in str(e.value), str(e.value)


def test_a_validation_file_and_a_validation_split_together_are_refused(tmp_path, cli):
    _csv(tmp_path / "train.csv", 30, 0)
    _csv(tmp_path / "val.csv", 10, 1)
    cfg = write(tmp_path / "c.yaml", CONFIG % "val.csv")
    r = cli("train", cfg, "--set", "train.validation_split=0.2", "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and r.err.count("\n") == 1
    assert ("train.validation_split: 0.2 asks for a split, but data.validation_path already gives the validation "
            "samples") in r.err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
