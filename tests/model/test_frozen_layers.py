"""``trainable: false`` on a model entry: the layer's parameters keep their values (initial, or
loaded with --init-from) while the rest of the model trains."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_cli, write
from dlrun.runs import checkpoint
from dlrun.config import load_config
from dlrun.errors import ConfigError
from dlrun.runs.assembly import build_model
from dlrun.runs.run import train

CONFIG = """\
data: {type: spiral, points_per_class: 40}
model:
  - {type: Linear, units: 16%s}
  - ReLU
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.5, momentum: 0.9}
regularizer: {type: L2, strength: 0.01}
train: {epochs: 4, batch_size: 30}
"""


def _run(tmp_path, frozen: bool, *extra):
    cfg = write(tmp_path / ("frozen.yaml" if frozen else "plain.yaml"), CONFIG % (", trainable: false" if frozen else ""))
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", *extra)
    assert r.code == 0, r.err
    return max((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime), r


def test_a_frozen_layer_keeps_its_initial_weights_and_the_others_train(tmp_path):
    """Momentum and an L2 penalty would move any tensor the optimizer saw, even with a zero gradient."""
    run_dir, r = _run(tmp_path, frozen=True)
    assert "(48 fixed)" in r.out  # the summary counts the frozen tensors as fixed
    start = build_model(load_config(run_dir / "config.yaml"), (2,)).state_arrays()  # the recorded seed
    end = checkpoint.read(run_dir / "checkpoints" / "last.npz")
    for k in ("0.weight", "0.bias"):
        np.testing.assert_array_equal(end.model[k], start[k])
    assert not np.array_equal(end.model["2.weight"], start["2.weight"])
    assert sorted(end.optimizer) == ["2.bias/velocity", "2.weight/velocity", "iterations"]  # none for layer 0
    assert "trainable: false" in (run_dir / "config.yaml").read_text()


def test_fine_tuning_loads_every_weight_and_trains_only_the_unfrozen_layers(tmp_path):
    base, _ = _run(tmp_path, frozen=False)
    ckpt = base / "checkpoints" / "last.npz"
    tuned, _ = _run(tmp_path, True, "--init-from", ckpt, "--set", "train.epochs=2")
    before, after = checkpoint.read(ckpt).model, checkpoint.read(tuned / "checkpoints" / "last.npz").model
    for k in ("0.weight", "0.bias"):
        np.testing.assert_array_equal(after[k], before[k])
    assert not np.array_equal(after["2.weight"], before["2.weight"])
    r = run_cli("train", "--resume", tuned, "--set", "train.epochs=3")  # the optimizer state fits on resume
    assert r.code == 0, r.err
    np.testing.assert_array_equal(checkpoint.read(tuned / "checkpoints" / "last.npz").model["0.weight"],
                                  before["0.weight"])


@pytest.mark.parametrize("entry,message", [
    (", trainable: 3", "model[0].trainable: expected true or false, got 3"),
    (", trainable: yes please", "model[0].trainable: expected true or false"),
])
def test_a_bad_trainable_value_is_reported_at_its_line(tmp_path, entry, message):
    p = write(tmp_path / "c.yaml", CONFIG % entry)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert message in str(e.value) and "c.yaml:3" in str(e.value), str(e.value)


def test_freezing_a_layer_without_parameters_is_refused(tmp_path, cli):
    p = write(tmp_path / "c.yaml", CONFIG % "")
    r = cli("train", p, "--set", "model[1].trainable=false", "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "model[1].trainable: ReLU has no trainable parameters, so trainable: false would freeze nothing" in r.err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_trainable_true_is_the_default_and_recorded_options_survive(tmp_path):
    p = write(tmp_path / "c.yaml", CONFIG % ", trainable: true, units: 1.6e1".replace(", units: 1.6e1", ""))
    cfg = load_config(p)
    assert cfg.frozen == []
    p2 = write(tmp_path / "d.yaml", CONFIG.replace("units: 16%s", "units: 1.6e1, trainable: false"))
    cfg2 = load_config(p2)
    assert cfg2.frozen == [0] and cfg2.model[0] == {"type": "Linear", "units": 16, "trainable": False}
    result = train(cfg2, runs_dir=tmp_path / "runs")
    assert [p.trainable for p in result.trainer.model.layers[0].params.values()] == [False, False]


def test_check_counts_the_frozen_parameters_as_fixed(tmp_path, cli):
    p = write(tmp_path / "c.yaml", CONFIG % ", trainable: false")
    r = cli("check", p)
    assert r.code == 0, r.err
    assert "48 (48 fixed)" in r.out and "51 " in r.out


def test_a_misspelt_trainable_is_suggested(tmp_path):
    p = write(tmp_path / "c.yaml", CONFIG % ", trainabel: false")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "model[0].trainabel: unknown option 'trainabel' for layer Linear (did you mean trainable?)" in str(e.value)
    assert "(and trainable, which any layer takes)" in str(e.value)


def test_freezing_every_layer_is_refused(tmp_path, cli):
    p = write(tmp_path / "c.yaml", CONFIG % ", trainable: false")
    r = cli("train", p, "--set", "model[2].trainable=false", "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "model[2].trainable: every layer with parameters is frozen (trainable: false): nothing would train" in r.err


def test_changing_what_is_frozen_on_resume_names_the_change(tmp_path):
    run_dir, _ = _run(tmp_path, frozen=True)  # SGD with momentum: velocity only for layer 2
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=6", "--set", "model[0].trainable=true")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "model[0].trainable changed (false -> true) since the run started" in r.err and "--init-from" in r.err


def test_trainable_outside_a_model_entry_says_where_it_belongs(cli):
    """dlrun gradcheck --set trainable=false used to answer 'unknown option (did you mean trainable?)'."""
    r = cli("gradcheck", "Linear", "--set", "trainable=false")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "Linear.trainable: 'trainable' is a key of a model entry (model[i].trainable), not an option" in r.err
    assert "did you mean" not in r.err
