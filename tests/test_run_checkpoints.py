"""The run directory's checkpoints: last.npz every N epochs, best.npz by the monitored metric."""
from __future__ import annotations

from checkpoint_helpers import metrics_rows, spiral_config, summary, train
from conftest import run_cli
from dlrun import checkpoint, run
from dlrun.config import load_config
from dlrun.trainer import Callback


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
