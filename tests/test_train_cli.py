"""End-to-end: `dlrun train` writes a complete run directory; exit codes; reproducibility."""
import csv
import json

import numpy as np
import pytest
import yaml

from conftest import CONFIGS, write
from dlrun import checkpoint, run
from dlrun.backend import gpu_available
from dlrun.config import load_config

TINY = """\
seed: 5
data: {type: spiral, classes: 3, points_per_class: 20}
model:
  - {type: Linear, units: 16}
  - ReLU
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.5, momentum: 0.9}
regularizer: {type: L2, strength: 1.0e-4}
train: {epochs: 4, batch_size: 16, validation_split: 0.25}
"""


def test_printed_paths_survive_a_narrow_terminal(tmp_path, cli):
    """The run directory is printed on one line at any width, so it can be copied whole."""
    cfg = write(tmp_path / "tiny.yaml", TINY)
    runs = tmp_path / ("a-rather-long-folder-name-for-the-runs-of-this-experiment" * 2)
    r = cli("train", cfg, "--runs-dir", runs, "--set", "train.epochs=1", env={"COLUMNS": "40"})
    assert r.code == 0, r.err
    printed = r.out.strip().splitlines()[-1]
    assert printed.startswith(str(runs)) and (runs / printed.split("/")[-1]).is_dir()


def test_train_writes_a_run_directory(tmp_path, cli):
    cfg = write(tmp_path / "tiny.yaml", TINY)
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs", "--set", "train.epochs=3")
    assert r.code == 0, r.err
    run_dir = tmp_path / "runs" / r.out.strip().splitlines()[-1].split("/")[-1]
    assert run_dir.is_dir() and run_dir.name.startswith("tiny-")
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["seed"] == 5 and resolved["train"]["epochs"] == 3
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "epochs", "seconds"):
        assert k in summary
    assert summary["epochs"] == 3 and summary["val_accuracy"] is not None
    assert float(rows[-1]["train_loss"]) == pytest.approx(summary["train_loss"])
    params, _, meta = checkpoint.load(run_dir / "checkpoints" / "last.npz")
    assert set(params) == {"0.weight", "0.bias", "2.weight", "2.bias"} and meta["epoch"] == 3
    assert "model" in r.out and "parameters" in r.out  # summary table printed


def test_runs_are_never_overwritten(tmp_path, cli):
    cfg = write(tmp_path / "tiny.yaml", TINY)
    dirs = {cli("train", cfg, "--runs-dir", tmp_path / "runs", "--set", "train.epochs=1").out.splitlines()[-1]
            for _ in range(2)}
    assert len(dirs) == 2


def test_seed_is_recorded_when_not_given(tmp_path, cli):
    cfg = write(tmp_path / "tiny.yaml", TINY.replace("seed: 5\n", ""))
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs", "--set", "train.epochs=1")
    run_dir = r.out.strip().splitlines()[-1]
    seed = yaml.safe_load(open(f"{run_dir}/config.yaml"))["seed"]
    assert isinstance(seed, int)
    assert json.load(open(f"{run_dir}/summary.json"))["seed"] == seed


def test_same_seed_gives_bit_identical_metrics(tmp_path):
    cfg_path = write(tmp_path / "tiny.yaml", TINY)
    histories = []
    for i in range(2):
        res = run.train(load_config(cfg_path), tmp_path / f"runs{i}")
        histories.append([(r["train_loss"], r["train_accuracy"], r["val_loss"], r["val_accuracy"])
                          for r in res.history.rows])
        weights = res.trainer.model.state_arrays()
        if i == 0:
            first = weights
    assert histories[0] == histories[1]
    assert all(np.array_equal(first[k], weights[k]) for k in first)
    other = run.train(load_config(cfg_path, seed=6), tmp_path / "runs_other")
    assert [r["train_loss"] for r in other.history.rows] != [h[0] for h in histories[0]]


@pytest.mark.parametrize("args,code,fragment", [
    (["train", "missing.yaml"], 2, "config file not found: missing.yaml"),
    (["train", "{cfg}", "--set", "train.epochs=zero"], 2, "--set train.epochs=zero: train.epochs: expected a positive integer"),
    (["train", "{cfg}", "--set", "model[0].type=Linaer"], 2, "did you mean Linear?"),
    pytest.param(["train", "{cfg}", "--device", "gpu"], 2, "device 'gpu'",
                 marks=pytest.mark.skipif(gpu_available(), reason="a GPU is present: --device gpu works here")),
    (["train", "{cfg}", "--set", "optimizer.learning_rate=1.0e+30"], 1, "produced inf in forward"),
    (["show", "Linaer"], 2, "did you mean Linear"),
    (["list", "layer"], 2, "did you mean layers?"),
    (["train"], 2, "give a CONFIG file to train"),
])
def test_exit_codes_and_one_line_errors(tmp_path, cli, args, code, fragment):
    cfg = write(tmp_path / "tiny.yaml", TINY)
    r = cli(*[a.replace("{cfg}", str(cfg)) for a in args], "--runs-dir", tmp_path / "runs") if args[0] == "train" \
        else cli(*args)
    assert r.code == code, (r.out, r.err)
    assert fragment in r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("args", [("--debug", "train", "missing.yaml"), ("train", "missing.yaml", "--debug")],
                         ids=["before", "after the command"])
def test_debug_flag_shows_traceback(tmp_path, cli, args):
    r = cli(*args)
    assert r.code == 2 and "Traceback" in r.err and "config file not found: missing.yaml" in r.err


def test_list_and_show(cli):
    r = cli("list")
    assert r.code == 0
    for name in ("Linear", "he_normal", "SoftmaxCrossEntropy", "L2", "SGD", "spiral"):
        assert name in r.out
    r = cli("show", "Linear")
    assert r.code == 0 and "units" in r.out and "a positive integer" in r.out and "(required)" in r.out


def test_show_at_80_columns_keeps_option_names_whole_and_writes_defaults_as_yaml(cli):
    r = cli("show", "Linear", env={"COLUMNS": "80"})
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in r.out.splitlines() if line.startswith("│") and line.split("│")[1].strip()}
    assert {"weight_initializer", "weight_regularizer", "bias_regularizer"} <= set(rows)  # were cut with …
    assert rows["use_bias"][1] == "true" and rows["weight_regularizer"][1] == "null"  # not True / None
    assert rows["weight_initializer"][1] == "xavier_uniform"  # not 'xavier_uniform'
    assert "initial_accumulator_value" in cli("show", "AdaGrad", env={"COLUMNS": "80"}).out


def test_docs_in_list_and_show_read_as_plain_text(cli):
    from dlrun import registry

    for reg in registry.REGISTRIES.values():
        for name in reg.names():
            text = reg.description(name) + " ".join(o.doc for o in reg.options(name))
            assert "``" not in text and ":func:" not in text and ":class:" not in text, name
    # the summary is the docstring's whole first paragraph (Softmax's ended at 'over the last axis;')
    assert registry.layers.summary("Softmax").endswith("∂L/∂x = y ⊙ (dy - Σ_j dy_j y_j).")
    assert "(`choose_layout`)" in cli("show", "Conv2D").out


@pytest.mark.slow
def test_spiral_config_reaches_97_percent(tmp_path, cli):
    r = cli("train", CONFIGS / "spiral.yaml", "--runs-dir", tmp_path)
    assert r.code == 0, r.err
    summary = json.loads(open(r.out.strip().splitlines()[-1] + "/summary.json").read())
    assert summary["train_accuracy"] >= 0.97


@pytest.mark.parametrize("name", ["spiral_deep", "regression"])
def test_other_shipped_core_configs_train(tmp_path, name):
    res = run.train(load_config(CONFIGS / f"{name}.yaml", ["train.epochs=40"]), tmp_path)
    rows = res.history.rows
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    if name == "regression":
        assert rows[-1]["val_loss"] < 0.05  # the target's variance is ~0.9
