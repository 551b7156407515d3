"""A graph model through every command: train (its table), check, time, --resume bit for bit,
predict, evaluate, --init-from, trainable: false on a block, the non-finite guard naming the node."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import CONFIGS, run_cli, write
from dlrun.config import load_config
from dlrun.runs import checkpoint
from dlrun.runs.assembly import build_model
from resume_helpers import (NOISE, InterruptAt, _config_and_straight_run, _forget_noise_plugin,  # noqa: F401
                            _interrupted, _resume_equals)

GRAPH = """\
name: graph
seed: 4
plugins: [noise_plugin.py]
data: {type: spiral, classes: 3, points_per_class: 30, noise: 0.2, seed: 2}
model:
  - {type: Linear, units: 8, name: stem}
  - type: Residual
    name: res
    body:
      - {type: Linear, units: 8}
      - TestNoise
      - Tanh
      - {type: Dropout, rate: 0.2}
      - {type: Linear, units: 8}
  - type: Parallel
    branches:
      - [{type: Linear, units: 4}, ReLU]
      - [BatchNorm, {type: Linear, units: 4}]
    merge: concat
  - {type: Linear, units: 3, name: head}
  - {type: Multiply, inputs: [head, head], name: sq}
  - {shares: head, inputs: [stem], name: head2}
  - {type: Add, inputs: [sq, head2]}
loss: SoftmaxCrossEntropy
optimizer: {type: Adam, learning_rate: 0.02}
train: {epochs: EPOCHS, batch_size: 16, shuffle: true, validation_split: 0.2}
"""


def test_the_model_table_shows_each_node_with_its_inputs_and_an_unused_node_warns(tmp_path):
    write(tmp_path / "noise_plugin.py", NOISE)
    cfg = write(tmp_path / "g.yaml", GRAPH.replace("EPOCHS", "1").replace(
        "  - {type: Add, inputs: [sq, head2]}\n", "  - {type: Add, inputs: [sq, head2], name: out}\n"
        "  - {type: Linear, units: 2, inputs: [stem], name: spare}\n  - {type: Linear, units: 3, inputs: [out]}\n"))
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    assert "warning:" in r.err and "spare (model[7])" in r.err and "left out" in r.err
    assert "inputs" in r.out and "model[1].body[0]" in r.out and "sq, head2" in r.out
    assert "shares head" in r.out
    r = run_cli("check", cfg)
    assert r.code == 0, r.err
    assert "← sq, head2" in r.out and "spare" in r.err
    r = run_cli("time", cfg, "--batches", "2")
    assert r.code == 0, r.err
    assert "model[1].body[4] Linear" in r.out and "head2 Linear" in r.out


def test_resuming_a_graph_run_equals_the_straight_run_bit_for_bit(tmp_path):
    """Dropout and the plugin's noise draw from their generators, BatchNorm keeps running
    statistics, the shared node sums its gradients: all restored exactly."""
    cfg, straight = _config_and_straight_run(tmp_path, GRAPH.replace("EPOCHS", "3"))
    resumed, _ = _interrupted(cfg, tmp_path / "b", InterruptAt(2, 2))
    _resume_equals(straight, resumed)


def test_predict_evaluate_and_init_from_use_the_graph(tmp_path):
    write(tmp_path / "noise_plugin.py", NOISE)
    cfg = write(tmp_path / "g.yaml", GRAPH.replace("EPOCHS", "2"))
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    run_dir = r.out.strip().splitlines()[-1]
    ckpt = checkpoint.read(f"{run_dir}/checkpoints/last.npz")
    assert ckpt.meta["nodes"][:3] == ["Linear", "Linear", "TestNoise"]
    x = np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = run_cli("predict", run_dir, "--input", tmp_path / "x.npy", "--plugin", tmp_path / "noise_plugin.py")
    assert r.code == 0, r.err
    model = build_model(load_config(cfg), (2,))
    model.load_state_arrays(ckpt.model)
    expected = model.predict(x).argmax(1)
    assert [int(line.split(",")[0]) for line in r.out.strip().splitlines()[1:]] == list(expected)
    r = run_cli("evaluate", run_dir, "--plugin", tmp_path / "noise_plugin.py")
    assert r.code == 0, r.err and "accuracy" in r.out
    # fine-tuning with the residual block frozen: its weights stay, the rest trains
    frozen = write(tmp_path / "f.yaml", GRAPH.replace("EPOCHS", "1").replace("    name: res\n",
                                                                             "    name: res\n    trainable: false\n"))
    r = run_cli("train", frozen, "--runs-dir", tmp_path / "runs2", "--init-from", run_dir)
    assert r.code == 0, r.err
    after = checkpoint.read(f"{r.out.strip().splitlines()[-1]}/checkpoints/last.npz").model
    assert np.array_equal(after["1.weight"], ckpt.model["1.weight"])  # model[1].body[0]
    assert not np.array_equal(after["0.weight"], ckpt.model["0.weight"])
    # a checkpoint of another graph does not fit, and says which layers differ
    other = write(tmp_path / "o.yaml", GRAPH.replace("EPOCHS", "1").replace("      - TestNoise\n", ""))
    r = run_cli("train", other, "--runs-dir", tmp_path / "runs3", "--init-from", run_dir)
    assert r.code != 0 and "TestNoise" in r.err


def test_the_non_finite_guard_names_the_node(tmp_path):
    cfg = write(tmp_path / "nan.yaml", """\
data: {type: spiral, classes: 3, points_per_class: 20}
model:
  - {type: Linear, units: 4, name: c, weight_initializer: {type: constant, value: 1.0e+20}}
  - {type: Linear, units: 4, inputs: [input], name: d}
  - {type: Multiply, inputs: [c, d, c, c], name: gate}
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.1}
train: {epochs: 1, batch_size: 20}
""")
    r = run_cli("check", cfg)
    assert r.code != 0 and "model[2]" in r.err and "Multiply" in r.err and "inf" in r.err, r.err
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")  # the guard's replay of the batch
    assert r.code == 1 and "batch 1: model[2] Multiply() produced inf in forward" in r.err, r.err
