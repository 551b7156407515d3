"""Exact resume: N epochs + resume for N more equals 2N epochs straight, bit for bit (CPU)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, spiral_config, summary, train
from conftest import CONFIGS, run_cli, write
from dlrun.runs import checkpoint
from resume_helpers import NOISE, NOISY, _assert_same_state


@pytest.mark.slow
def test_resume_equals_straight_run_with_stochastic_plugin_layer(tmp_path):
    write(tmp_path / "noise_plugin.py", NOISE)
    straight_cfg = write(tmp_path / "straight.yaml", NOISY.replace("EPOCHS", "6"))
    half_cfg = write(tmp_path / "half.yaml", NOISY.replace("EPOCHS", "3"))
    straight = train(straight_cfg, tmp_path / "a")
    half = train(half_cfg, tmp_path / "b")
    assert len(metrics_rows(half)) == 3
    r = run_cli("train", "--resume", half, "--set", "train.epochs=6", "--plugin", tmp_path / "noise_plugin.py")
    assert r.code == 0, r.err
    _assert_same_state(straight / "checkpoints" / "last.npz", half / "checkpoints" / "last.npz")
    _assert_same_state(straight / "checkpoints" / "best.npz", half / "checkpoints" / "best.npz")
    assert metrics_rows(straight) == metrics_rows(half)  # metrics appended, bit-identical text
    s, h = summary(straight), summary(half)
    for k in ("train_loss", "val_loss", "val_accuracy", "final_train_loss", "final_train_accuracy", "best"):
        assert s[k] == h[k], k
    assert h["resumed_from_epoch"] == 3 and h["epochs"] == 6
    meta = checkpoint.read(half / "checkpoints" / "last.npz").meta
    assert meta["plugins"][0]["defines"] == ["TestNoise"] and len(meta["plugins"][0]["sha256"]) == 64
    assert meta["rng"]["layers"]["1"]["bit_generator"] == "PCG64"


@pytest.mark.slow
def test_resume_every_n_epochs_drops_rows_after_the_checkpoint(tmp_path):
    """With checkpoint_every: 2 an interrupted run's extra metrics rows are replaced on resume."""
    cfg = spiral_config(tmp_path, epochs=5, extra="")
    straight = train(cfg, tmp_path / "a", "--set", "train.checkpoint_every=2")
    run = train(cfg, tmp_path / "b", "--set", "train.checkpoint_every=2", "--set", "train.epochs=3")
    # simulate a crash after epoch 3's metrics row but before a checkpoint at epoch 3: roll last back to 2
    assert checkpoint.read(run / "checkpoints" / "last.npz").meta["epoch"] == 3  # written at the end
    half = train(cfg, tmp_path / "c", "--set", "train.checkpoint_every=2", "--set", "train.epochs=2")
    (run / "checkpoints" / "last.npz").write_bytes((half / "checkpoints" / "last.npz").read_bytes())
    r = run_cli("train", "--resume", run, "--set", "train.epochs=5")
    assert r.code == 0, r.err
    assert metrics_rows(run) == metrics_rows(straight)
    _assert_same_state(straight / "checkpoints" / "last.npz", run / "checkpoints" / "last.npz")


@pytest.mark.slow
def test_resume_refuses_a_finished_run_and_bad_arguments(tmp_path):
    run = train(spiral_config(tmp_path, epochs=2), tmp_path / "runs")
    r = run_cli("train", "--resume", run)
    assert r.code == 2 and "already trained 2 of 2 epochs" in r.err and "train.epochs=" in r.err
    r = run_cli("train", "--resume", run, "--seed", "4")
    assert r.code == 2 and "--resume" in r.err
    r = run_cli("train", "--resume", tmp_path / "nowhere")
    assert r.code == 2 and "not a run directory" in r.err
    r = run_cli("train")
    assert r.code == 2 and "CONFIG" in r.err
    # a config.yaml that is not UTF-8 any more (edited by hand) is rewritten, as the warning says
    with open(run / "config.yaml", "ab") as f:
        f.write(b"# caf\xe9\n")
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3")
    assert r.code == 0 and "edited by hand" in r.err, r.err


@pytest.mark.slow
def test_init_from_uses_weights_with_a_fresh_optimizer(tmp_path):
    """Plain full-batch SGD keeps no state, so init-from + 1 epoch equals resume + 1 epoch;
    with momentum the fresh (zero) velocity makes them differ."""
    for momentum, same in ((0.0, True), (0.9, False)):
        cfg = spiral_config(tmp_path, name=f"m{momentum}", momentum=momentum, epochs=3, batch_size="null",
                            shuffle="false")
        base = train(cfg, tmp_path / f"base{momentum}")
        ckpt = base / "checkpoints" / "last.npz"
        tuned = train(cfg, tmp_path / f"tuned{momentum}", "--init-from", ckpt, "--set", "train.epochs=1")
        assert summary(tuned)["init_from"] == str(ckpt.absolute())
        r = run_cli("train", "--resume", base, "--set", "train.epochs=4")
        assert r.code == 0, r.err
        a = checkpoint.read(tuned / "checkpoints" / "last.npz").model
        b = checkpoint.read(base / "checkpoints" / "last.npz").model
        assert all(np.array_equal(a[k], b[k]) for k in a) is same


def test_init_from_refuses_mismatched_parameters(tmp_path):
    base = train(spiral_config(tmp_path, epochs=1), tmp_path / "runs")
    other = write(tmp_path / "other.yaml", spiral_config(tmp_path, epochs=1).read_text()
                  .replace("units: 16", "units: 8"))
    r = run_cli("train", other, "--runs-dir", tmp_path / "runs2", "--init-from", base)
    assert r.code == 2
    assert "does not fit the model" in r.err
    assert "0.weight: shape (16, 2) in the checkpoint, (8, 2) in the model" in r.err
    assert "2.weight: shape (3, 16) in the checkpoint, (3, 8) in the model" in r.err
    assert not (tmp_path / "runs2").exists() or not any((tmp_path / "runs2").iterdir())


CONTROLLED = """\
name: controlled
seed: 4
data: {type: spiral, classes: 3, points_per_class: 30, noise: 0.2, seed: 2}
model: [{type: Linear, units: 12}, ReLU, {type: Linear, units: 3}]
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.3, momentum: 0.9}
train:
  epochs: EPOCHS
  batch_size: 16
  validation_split: 0.2
  schedule: {type: warmup, epochs: 2, then: {type: reduce_on_plateau, monitor: val_loss, patience: 1,
             min_delta: 0.5, factor: 0.5, cooldown: 1}}
  early_stopping: {monitor: val_loss, patience: PATIENCE, min_delta: 0.5}
"""


@pytest.mark.parametrize("patience,half,total", [(20, 3, 6), (2, 2, 8)], ids=["plateau-schedule", "early-stopping"])
def test_resume_continues_schedule_and_early_stopping_state(tmp_path, patience, half, total):
    """reduce_on_plateau's rate and counters, lr0 behind a warm-up, and early stopping's wait all
    come back from the checkpoint: the resumed run reduces the rate and stops when the straight
    run does (a fresh start would restart the counters and diverge)."""
    text = CONTROLLED.replace("PATIENCE", str(patience))
    straight = train(write(tmp_path / "s.yaml", text.replace("EPOCHS", str(total))), tmp_path / "a")
    part = train(write(tmp_path / "h.yaml", text.replace("EPOCHS", str(half))), tmp_path / "b")
    r = run_cli("train", "--resume", part, "--set", f"train.epochs={total}")
    assert r.code == 0, r.err
    rows = metrics_rows(straight)
    assert metrics_rows(part) == rows
    rates = [float(x["learning_rate"]) for x in rows]
    if patience == 2:
        assert len(rows) == 3  # stopped by early stopping at epoch 3, in both runs
    else:
        assert min(rates[2:]) < max(rates)  # the plateau schedule reduced the rate after the resume point


# CONTROLLED without the schedule, with a rate so large that val_loss is best early, and
# early stopping that restores the best weights
OVERSHOOT = (CONTROLLED.replace("learning_rate: 0.3", "learning_rate: 2.0")
             .replace(CONTROLLED[CONTROLLED.index("  schedule:"):CONTROLLED.index("  early_stopping:")], "")
             .replace("PATIENCE, min_delta: 0.5}", "4, restore_best_weights: true}"))


def test_restore_best_weights_after_a_resume_restores_a_best_from_before_it(tmp_path):
    """A too-large rate: val_loss is best at epoch 2, then never again, so early stopping ends
    at epoch 6 and puts epoch 2's weights back. Stopped after epoch 3 and resumed, the run must
    end with the same weights, which it now takes from best.npz (they are not in last.npz)."""
    straight = train(write(tmp_path / "s.yaml", OVERSHOOT.replace("EPOCHS", "12")), tmp_path / "a")
    part = train(write(tmp_path / "h.yaml", OVERSHOOT.replace("EPOCHS", "3")), tmp_path / "b")
    assert checkpoint.read(part / "checkpoints" / "best.npz").meta["best"]["epoch"] == 2
    r = run_cli("train", "--resume", part, "--set", "train.epochs=12")
    assert r.code == 0, r.err
    assert metrics_rows(part) == metrics_rows(straight) and len(metrics_rows(part)) == 6
    # final_* are evaluated on the restored weights (without them, on epoch 6's: a different value)
    for key in ("final_train_loss", "final_train_accuracy"):
        assert summary(part)[key] == summary(straight)[key], key


def test_resume_warns_when_the_run_config_was_edited(tmp_path):
    run = train(spiral_config(tmp_path, epochs=2), tmp_path / "runs")
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3")
    assert r.code == 0 and "warning" not in r.err, r.err  # untouched (and rewritten with the override)
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("epochs: 3", "epochs: 9"))
    r = run_cli("train", "--resume", run, "--set", "train.epochs=4")
    assert r.code == 0, r.err
    assert "config.yaml differs from the config recorded in the checkpoint" in r.err and "--set" in r.err


def test_resume_takes_a_new_learning_rate_and_a_new_schedule(tmp_path):
    """--set optimizer.learning_rate on --resume sets lr₀ for the schedule (the recorded lr₀ used to
    win, while config.yaml recorded the new one), reduce_on_plateau's reductions so far scale with
    it, and a schedule of another type starts afresh (its state lookup was an internal KeyError)."""
    step = (CONTROLLED.replace("PATIENCE", "50")
            .replace(CONTROLLED[CONTROLLED.index("  schedule:"):CONTROLLED.index("  early_stopping:")],
                     "  schedule: {type: step, step_size: 1, gamma: 0.5}\n"))
    run = train(write(tmp_path / "s.yaml", step.replace("EPOCHS", "2")), tmp_path / "a")
    r = run_cli("train", "--resume", run, "--set", "train.epochs=4", "--set", "optimizer.learning_rate=1.0")
    assert r.code == 0, r.err
    assert [float(x["learning_rate"]) for x in metrics_rows(run)] == [0.3, 0.15, 0.25, 0.125]  # 1.0·0.5^(e−1)
    r = run_cli("train", "--resume", run, "--set", "train.epochs=6", "--set",
                "train.schedule={type: reduce_on_plateau, monitor: train_loss, patience: 0, min_delta: 10}")
    assert r.code == 0, r.err
    # a fresh plateau schedule starts at lr₀; epoch 5 sets its best, epoch 6 fails to beat it by 10
    assert [float(x["learning_rate"]) for x in metrics_rows(run)[4:]] == [1.0, 1.0]
    # the state (1.0 reduced to 0.1 after epoch 6) follows a doubled lr₀
    r = run_cli("train", "--resume", run, "--set", "train.epochs=7", "--set", "optimizer.learning_rate=2.0")
    assert r.code == 0, r.err
    assert float(metrics_rows(run)[-1]["learning_rate"]) == pytest.approx(0.2)


def test_a_run_reads_its_data_from_any_directory_after_training_from_a_relative_path(tmp_path):
    """`cd proj && dlrun train configs/c.yaml` recorded `configs/data/d.csv`, relative to proj, so
    evaluate and --resume from elsewhere failed with 'data file not found'."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 2))
    rows = "\n".join(f"{a:.6f},{b:.6f},{int(a > 0)}" for a, b in x)
    write(tmp_path / "proj" / "configs" / "data" / "d.csv", rows + "\n")
    write(tmp_path / "proj" / "configs" / "c.yaml", """\
name: rel
seed: 1
data: {type: file, path: data/d.csv}
model: [{type: Linear, units: 2}]
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.1}
train: {epochs: 2, batch_size: 8, validation_split: 0.25}
""")
    r = run_cli("train", "configs/c.yaml", "--runs-dir", tmp_path / "runs", cwd=tmp_path / "proj")
    assert r.code == 0, r.err
    run = Path(r.out.strip().splitlines()[-1])
    if not run.is_absolute():
        run = tmp_path / "proj" / run
    recorded = checkpoint.read(run / "checkpoints" / "last.npz").meta["config"]["data"]["path"]
    assert Path(recorded) == (tmp_path / "proj" / "configs" / "data" / "d.csv").resolve()
    (tmp_path / "elsewhere").mkdir()
    r = run_cli("evaluate", run, "--json", cwd=tmp_path / "elsewhere")
    assert r.code == 0, r.err
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3", cwd=tmp_path / "elsewhere")
    assert r.code == 0, r.err


def test_per_step_schedule_resumes_exactly_and_records_the_last_steps_rate(tmp_path):
    text = (CONTROLLED.replace("PATIENCE", "50")
            .replace(CONTROLLED[CONTROLLED.index("  schedule:"):CONTROLLED.index("  early_stopping:")],
                     "  schedule: {type: warmup, epochs: 1, then: {type: cosine, period: 3}}\n"
                     "  schedule_interval: step\n"))
    straight = train(write(tmp_path / "s.yaml", text.replace("EPOCHS", "4")), tmp_path / "a")
    part = train(write(tmp_path / "h.yaml", text.replace("EPOCHS", "2")), tmp_path / "b")
    r = run_cli("train", "--resume", part, "--set", "train.epochs=4")
    assert r.code == 0, r.err
    rows = metrics_rows(straight)
    assert metrics_rows(part) == rows
    # 72 training samples at batch 16: 5 steps an epoch; a row holds the rate of its epoch's last
    # step: lr₀ = 0.3 at the end of the warm-up, then cosine over 3 epochs = 15 steps, of which
    # 4, 9 and 14 are done before the last step of epochs 2, 3 and 4
    expect = [0.3] + [0.15 * (1 + np.cos(np.pi * k / 15)) for k in (4, 9, 14)]
    assert [float(x["learning_rate"]) for x in rows] == pytest.approx(expect, rel=1e-12)


FLAKY = '''
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Flaky(Layer):
    """Identity that raises in forward when told to."""

    def __init__(self, fail: bool = False):
        self.fail = fail

    def forward(self, x):
        if self.fail:
            raise RuntimeError("told to fail")
        return x * 1.0

    def backward(self, dy):
        return dy
'''


def test_a_resume_that_fails_before_a_good_step_leaves_config_yaml_as_the_checkpoint_records(tmp_path):
    """Resume writes config.yaml before training; when the resumed run then failed (a layer raised)
    before any good step, last.npz kept the old config but config.yaml the new one, and the next
    resume warned of a hand edit."""
    write(tmp_path / "flaky.py", FLAKY)
    cfg = write(tmp_path / "c.yaml", "plugins: [flaky.py]\ndata: {type: spiral, points_per_class: 20}\n"
                                     "model: [{type: Linear, units: 6}, Flaky, {type: Linear, units: 3}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: SGD\ntrain: {epochs: 2}\n")
    run = train(cfg, tmp_path / "runs")
    before = (run / "config.yaml").read_bytes()
    flaky = tmp_path / "flaky.py"
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3", "--set", "model[1].fail=true", "--plugin", flaky)
    assert r.code == 1 and "told to fail" in r.err, r.err
    assert (run / "config.yaml").read_bytes() == before
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3", "--plugin", flaky)
    assert r.code == 0 and "edited by hand" not in r.err, r.err


def test_a_resumed_run_counts_the_seconds_of_its_earlier_sessions(tmp_path):
    # summary.json's seconds came from the summary of the session before, which an interrupted
    # run does not have: 6 epochs run as 3 + interrupt + 3 reported the last session's 3.6 s, not 14 s
    run = train(spiral_config(tmp_path, epochs=2), tmp_path / "runs")
    rows = (run / "metrics.csv").read_text().splitlines()
    head = rows[0].split(",")
    at = head.index("seconds")
    long = [",".join(c if i != at else "100.0" for i, c in enumerate(r.split(","))) for r in rows[1:]]
    (run / "metrics.csv").write_text("\n".join([rows[0], *long]) + "\n")  # two epochs of 100 s each
    (run / "summary.json").unlink()  # as after an interrupt
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3")
    assert r.code == 0, r.err
    assert 200.0 <= summary(run)["seconds"] < 260.0


@pytest.mark.parametrize("change,where,key", [
    ("train.split_seed=99", "train.split_seed", "train.split_seed 3"),
    ("train.validation_split=0.3", "train.validation_split", "train.validation_split 0.2"),
    ("seed=4", "seed", "the run seed (train.split_seed unset) 3"),  # the run seed stands in for the split seed
])
def test_a_resume_that_would_change_the_validation_split_is_refused(tmp_path, change, where, key):
    """Later epochs would train on samples that earlier ones validated on."""
    run = train(spiral_config(tmp_path, epochs=2, split=0.2), tmp_path / "runs")
    before = (run / "metrics.csv").read_text()
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3", "--set", change)
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert f"--set {change}: {where}: the run held out its validation samples with {key}, " in r.err, r.err
    assert "start a new run from scratch" in r.err
    assert (run / "metrics.csv").read_text() == before
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3", "--set", "train.split_seed=" +
                str(summary(run)["seed"]))  # the same split, now named: accepted
    assert r.code == 0, r.err


def test_a_run_recorded_before_the_largest_remainder_split_keeps_its_split(tmp_path):
    """Iris at 0.25: the earlier split held out round(50 x 0.25) = 12 per class (36), the current
    one round(150 x 0.25) = 38 in all. A checkpoint without split_shares (written before) must be
    evaluated and resumed on the 36 it validated on, or 2 training samples would count as unseen."""
    cfg = write(tmp_path / "iris.yaml", (CONFIGS / "iris.yaml").read_text()
                .replace("epochs: 100", "epochs: 2").replace("validation_split: 0.2 ", "validation_split: 0.25 "))
    new = train(cfg, tmp_path / "new")
    assert checkpoint.read(new / "checkpoints" / "last.npz").meta["split_shares"] == "whole"
    old = train(cfg, tmp_path / "old")
    for name in ("last.npz", "best.npz"):  # as an earlier dlrun wrote them
        ckpt = checkpoint.read(old / "checkpoints" / name)
        checkpoint.save(ckpt.path, ckpt.model, ckpt.optimizer, {k: v for k, v in ckpt.meta.items()
                                                                 if k not in ("split_shares", "format")})
    samples = {}
    for d in (new, old):
        r = run_cli("evaluate", d, "--json")
        assert r.code == 0, r.err
        samples[d] = json.loads(r.out)["samples"]
    assert samples == {new: 38, old: 36}
    r = run_cli("train", "--resume", old, "--set", "train.epochs=3")
    assert r.code == 0, r.err
    assert checkpoint.read(old / "checkpoints" / "last.npz").meta["split_shares"] == "per_class"
    assert json.loads(run_cli("evaluate", old, "--json").out)["samples"] == 36
