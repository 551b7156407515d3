"""The run directory's checkpoints: last.npz every N epochs, best.npz by the monitored metric."""
from __future__ import annotations

from checkpoint_helpers import metrics_rows, spiral_config, summary, train
import numpy as np
import pytest
from conftest import run_cli, write
from dlrun.runs import checkpoint, run
from dlrun.config import load_config
from dlrun.training.hooks import Callback


def _best_epoch(rows, key, mode):
    values = [float(r[key]) for r in rows]
    target = min(values) if mode == "min" else max(values)
    return values.index(target) + 1  # first epoch reaching it (improvement is strict)


def test_best_by_monitor_and_mode(tmp_path):
    for monitor, split, mode in (("val_accuracy", 0.25, "max"), (None, 0.0, "min")):
        args = ["--set", f"train.validation_split={split}"] + ([] if monitor is None else ["--set", f"train.monitor={monitor}"])
        run = train(spiral_config(tmp_path, epochs=7, lr=1.0), tmp_path / f"runs{split}", *args)
        key = monitor or "train_loss"  # no validation split: train_loss by default
        best = summary(run)["best"]
        assert best["monitor"] == key and best["mode"] == mode
        assert best["epoch"] == _best_epoch(metrics_rows(run), key, mode)
        meta = checkpoint.read(run / "checkpoints" / "best.npz").meta
        assert meta["epoch"] == best["epoch"] and meta["best"] == best
        last = checkpoint.read(run / "checkpoints" / "last.npz").meta
        assert last["epoch"] == 7 and last["config"]["train"]["epochs"] == 7 and last["dlrun_version"]


def test_checkpoint_every_n_epochs_and_at_the_end(tmp_path):
    cfg = load_config(spiral_config(tmp_path, epochs=5), ["train.checkpoint_every=3"])
    seen = []

    class Probe(Callback):
        def on_epoch_end(self, epoch, metrics):  # runs after the checkpoint writer's hook
            last = self.run_dir / "checkpoints" / "last.npz"
            seen.append(checkpoint.read(last).meta["epoch"] if last.exists() else None)

        def on_train_begin(self, trainer):
            self.run_dir = next((tmp_path / "runs").iterdir())

    result = run.train(cfg, tmp_path / "runs", callbacks=[Probe()])
    assert seen == [None, None, 3, 3, 3]
    assert checkpoint.read(result.run_dir / "checkpoints" / "last.npz").meta["epoch"] == 5


def test_monitor_errors(tmp_path):
    r = run_cli("train", spiral_config(tmp_path, split=0.0), "--runs-dir", tmp_path / "r2",
                "--set", "train.monitor=val_loss")
    assert r.code == 2 and "'val_loss' needs validation data" in r.err and "train.monitor" in r.err
    assert not (tmp_path / "r2").exists() or not any((tmp_path / "r2").iterdir())
    r = run_cli("train", spiral_config(tmp_path), "--set", "train.monitor=val_los")
    assert r.code == 2 and "did you mean val_loss" in r.err


ES_CONFIG = """seed: 0
data: {type: spiral, classes: 3, points_per_class: 60, noise: 0.3}
model:
  - {type: Linear, units: 32}
  - ReLU
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.3, momentum: 0.9}
train: {epochs: 200, batch_size: 32, validation_split: 0.3}
"""


@pytest.mark.parametrize("stopping", ["{monitor: val_accuracy, patience: 5, restore_best_weights: true}",
                                      "{monitor: val_loss, patience: 8, min_delta: 0.02, restore_best_weights: true}"])
def test_the_weights_early_stopping_restores_are_the_ones_saved_in_best_npz(tmp_path, stopping):
    # best.npz followed train.monitor (val_loss) with a strict-improvement test: the restored
    # weights, which summary.json's final_* describe, were in no file and predict served others
    cfg = write(tmp_path / "es.yaml", ES_CONFIG)
    result = run.train(load_config(cfg, [f"train.early_stopping={stopping}"]), tmp_path / "runs")
    stopper = next(c for c in result.trainer.controls if type(c).__name__ == "EarlyStopping")
    assert stopper.stopped_epoch is not None and stopper.best_epoch < stopper.stopped_epoch
    best = checkpoint.read(result.run_dir / "checkpoints" / "best.npz")
    assert best.meta["best"]["epoch"] == stopper.best_epoch == result.summary["best"]["epoch"]
    assert best.meta["best"]["monitor"] == stopper.monitor
    restored = result.trainer.model.state_arrays()
    assert set(best.model) == set(restored)
    assert all(np.array_equal(best.model[k], np.asarray(restored[k])) for k in restored)


def test_restore_best_weights_on_another_metric_than_val_loss_survives_a_resume(tmp_path):
    # best.npz followed val_loss while early stopping watched val_accuracy: after a resume it
    # held no weights of early stopping's best epoch, and the run ended on the last epoch's
    stopping = "train.early_stopping={monitor: val_accuracy, patience: 5, restore_best_weights: true}"
    cfg = write(tmp_path / "es.yaml", ES_CONFIG)
    straight = run.train(load_config(cfg, [stopping]), tmp_path / "a")
    stopper = next(c for c in straight.trainer.controls if type(c).__name__ == "EarlyStopping")
    cut = stopper.best_epoch + 3  # after the best epoch, before the stop
    assert cut < stopper.stopped_epoch
    part = run.train(load_config(cfg, [stopping, f"train.epochs={cut}"]), tmp_path / "b").run_dir
    r = run_cli("train", "--resume", part, "--set", "train.epochs=200")
    assert r.code == 0, r.err
    assert metrics_rows(part) == metrics_rows(straight.run_dir)
    for key in ("final_train_loss", "final_train_accuracy"):
        assert summary(part)[key] == straight.summary[key], key
