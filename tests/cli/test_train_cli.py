"""End to end through the CLI: `dlrun train` writes a complete run directory; exit codes and
one-line errors; list and show; reproducibility; schedules in metrics.csv, early stopping,
clipping, the losses; and the shipped configs."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import CONFIGS, write
from dlrun.runs import checkpoint, run
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


@pytest.mark.parametrize("kind,names,shown,fragments", [
    (None, ("Linear", "he_normal", "SoftmaxCrossEntropy", "L2", "SGD", "spiral"), "Linear",
     ("units", "a positive integer", "(required)")),
    ("schedules", ("cosine", "warmup", "reduce_on_plateau", "step"), "warmup", ("start_factor", "then")),
], ids=["all", "schedules"])
def test_list_and_show(cli, kind, names, shown, fragments):
    r = cli("list", *([kind] if kind else []))
    assert r.code == 0
    for name in names:
        assert name in r.out
    r = cli("show", shown)
    assert r.code == 0 and all(f in r.out for f in fragments)


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
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs", *args)
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
    best = min(range(3), key=lambda i: float(rows[i]["val_loss"]))  # (best.npz: without min_delta)
    assert summary["stopped_early"] is True and summary["best"]["epoch"] == best + 1
    assert summary["best_epoch_metrics"] == pytest.approx({k: float(v) for k, v in rows[best].items()
                                                           if k.startswith(("train_", "val_"))})


def test_summary_names_the_best_epoch_and_its_metrics(cli, tmp_path):
    """summary.json holds the metrics of the epoch best.npz keeps (what the closing line shows),
    which the last epoch's need not be."""
    rows, summary = train(cli, tmp_path, BASE, "--set", "train.monitor=train_loss", "--set",
                          "optimizer.learning_rate=3.0")
    best = min(range(6), key=lambda i: float(rows[i]["train_loss"]))
    assert summary["best"]["epoch"] == best + 1 and summary["stopped_early"] is False
    assert summary["best_epoch_metrics"]["train_loss"] == pytest.approx(float(rows[best]["train_loss"]))
    assert summary["best_epoch_metrics"]["val_accuracy"] == pytest.approx(float(rows[best]["val_accuracy"]))


def test_bad_schedule_is_one_line_with_location(cli, tmp_path):
    cfg = write(tmp_path / "run.yaml", BASE + "  schedule: {type: cosin}\n")
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 2
    assert "run.yaml:13: train.schedule.type: unknown schedule 'cosin' (did you mean cosine?)" in r.err
    assert "Traceback" not in r.err and not (tmp_path / "runs").exists()


@pytest.mark.slow
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


def _reached(summary, config):
    """The mark each shipped config reaches through `dlrun train` as shipped."""
    if config == "spiral.yaml":
        return summary["train_accuracy"] >= 0.97
    if config == "iris.yaml":
        return summary["val_accuracy"] >= 0.85 and summary["train_accuracy"] >= 0.95
    if config == "digits_mlp.yaml":
        return summary["val_accuracy"] >= 0.95
    # regression_sine.yaml: the noise variance is 0.01
    return summary["val_loss"] < 0.03 and summary["train_accuracy"] is None


@pytest.mark.slow
@pytest.mark.parametrize("config", ["spiral.yaml", "iris.yaml", "digits_mlp.yaml", "regression_sine.yaml"])
def test_shipped_config_reaches_its_mark(cli, tmp_path, config):
    r = cli("train", CONFIGS / config, "--runs-dir", tmp_path)
    assert r.code == 0, r.err
    summary = json.loads((Path(r.out.strip().splitlines()[-1]) / "summary.json").read_text())
    assert _reached(summary, config), summary


def test_regression_sine_trains_with_a_huber_loss(cli, tmp_path):
    r = cli("train", CONFIGS / "regression_sine.yaml", "--runs-dir", tmp_path, "--set", "loss={type: Huber, delta: 0.5}",
            "--set", "train.epochs=60")
    assert r.code == 0, r.err


@pytest.mark.slow
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


@pytest.mark.parametrize("name", ["spiral_deep", pytest.param("regression", marks=pytest.mark.slow)])
def test_other_shipped_core_configs_train(tmp_path, name):
    res = run.train(load_config(CONFIGS / f"{name}.yaml", ["train.epochs=40"]), tmp_path)
    rows = res.history.rows
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    if name == "regression":
        assert rows[-1]["val_loss"] < 0.05  # the target's variance is ~0.9
