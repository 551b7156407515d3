"""The tensorboard logger: event files read back with TensorBoard's own reader and compared with
metrics.csv, across a resume, a Ctrl-C and a kill between an epoch's events and its checkpoint."""
from __future__ import annotations

import csv
import shutil
import sys

import pytest

from checkpoint_helpers import spiral_config, train
from conftest import run_cli
from dlrun.config import load_config
from dlrun.errors import Interrupted
from dlrun.runs import run, tensorboard
from resume_helpers import InterruptAt

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
plugin_data_pb2 = pytest.importorskip("tensorboard.plugins.hparams.plugin_data_pb2")


def _config(tmp_path, epochs=6, every=1):
    # batch_size 16 over 90 training samples: 6 batches a step each, so step 2k closes batch 2k of its epoch
    return spiral_config(tmp_path, epochs=epochs, extra="").read_text().replace(
        "train: {", "train: {loggers: [csv, tensorboard], log_every_n_steps: 2, " f"checkpoint_every: {every}, ")


def _events(run_dir):
    """{tag: [(step, value), ...]} from TensorBoard's reader, every event kept (no sampling)."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}, acc


def _csv(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _same_as_metrics_csv(run_dir, epochs):
    tags, _ = _events(run_dir)
    rows = _csv(run_dir)
    assert [int(r["epoch"]) for r in rows] == list(range(1, epochs + 1))
    for column in rows[0]:
        if column == "epoch":
            continue
        assert [s for s, _ in tags[column]] == list(range(1, epochs + 1)), column  # one value per epoch
        # (event files hold 32-bit floats)
        assert [v for _, v in tags[column]] == pytest.approx([float(r[column]) for r in rows], rel=1e-6), column
    return tags


def test_a_run_writes_every_metric_each_epoch_the_step_loss_and_its_hyperparameters(tmp_path):
    cfg = tmp_path / "tb.yaml"
    cfg.write_text(_config(tmp_path).replace("validation_split: 0.25", "validation_split: 0.25, metrics: [f1]"))
    run_dir = train(cfg, tmp_path / "runs")
    tags = _same_as_metrics_csv(run_dir, 6)
    assert {"train_loss", "val_loss", "train_accuracy", "val_accuracy", "train_f1", "val_f1", "learning_rate",
            "seconds"} <= set(tags)
    # 6 steps an epoch (90 samples, batches of 16): every 2nd step's batch loss, 18 in all
    steps = [s for s, _ in tags["step_loss"]]
    assert steps == list(range(2, 37, 2))
    assert all(0 < v < 5 for _, v in tags["step_loss"])
    # the hyper-parameters: the config's values by key path, for the HParams tab
    _, acc = _events(run_dir)
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = start.session_start_info.hparams
    assert hp["optimizer.learning_rate"].number_value == 0.5 and hp["optimizer.type"].string_value == "SGD"
    assert hp["model[0].units"].number_value == 16 and hp["train.batch_size"].number_value == 16
    assert hp["seed"].number_value == 3 and hp["loss"].string_value == "SoftmaxCrossEntropy"
    assert "_hparams_/session_end_info" in content  # the run ended


def test_ctrl_c_flushes_the_events_and_the_resumed_run_adds_no_step_twice(tmp_path):
    cfg = tmp_path / "tb.yaml"
    cfg.write_text(_config(tmp_path))
    runs = tmp_path / "runs"
    with pytest.raises(Interrupted):
        run.train(load_config(cfg), runs, callbacks=[InterruptAt(4, 3)])  # after batch 3 of epoch 4
    (run_dir,) = runs.iterdir()
    tags, _ = _events(run_dir)  # what was written before the stop is on disk
    assert [s for s, _ in tags["train_loss"]] == [1, 2, 3]
    assert [s for s, _ in tags["step_loss"]] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]  # step 20: batch 2 of epoch 4
    run.resume(run_dir, *run.resume_config(run_dir))
    tags = _same_as_metrics_csv(run_dir, 6)
    assert [s for s, _ in tags["step_loss"]] == list(range(2, 37, 2))
    assert len(tensorboard.event_files(run_dir)) == 2  # a file for each session


def test_a_resume_drops_the_events_written_after_its_checkpoint(tmp_path):
    """A process killed after logging epochs its checkpoint had not reached yet (checkpoint_every
    > 1) leaves events past last.npz: the resume removes them, as it trims metrics.csv."""
    cfg = tmp_path / "tb.yaml"
    cfg.write_text(_config(tmp_path, epochs=3))
    straight = train(cfg, tmp_path / "straight", "--set", "train.epochs=6")
    run_dir = train(cfg, tmp_path / "runs")
    kept = tmp_path / "epoch3.npz"
    shutil.copy(run_dir / "checkpoints" / "last.npz", kept)
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=6")
    assert r.code == 0, r.err
    shutil.copy(kept, run_dir / "checkpoints" / "last.npz")  # as if killed before epoch 6's checkpoint
    with open(tensorboard.event_files(run_dir)[-1], "ab") as f:
        f.write(b"\x13\x00\x00\x00\x00")  # and a record cut short by the kill
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=6")
    assert r.code == 0, r.err
    tags = _same_as_metrics_csv(run_dir, 6)
    assert [s for s, _ in tags["step_loss"]] == list(range(2, 37, 2))
    # the resumed run is the straight one, value for value
    straight_tags = _same_as_metrics_csv(straight, 6)
    for tag in ("train_loss", "val_loss", "step_loss"):
        assert tags[tag] == straight_tags[tag]


def test_without_tensorboardx_the_run_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch):
    cfg = tmp_path / "tb.yaml"
    cfg.write_text(_config(tmp_path))
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # (import fails, as when not installed)
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", process=False)
    assert r.code == 2
    assert r.err.strip().splitlines() == ["error: train.loggers: tensorboard needs the tensorboardX package; install "
                                          "it with pip install 'dlrun[tensorboard]' (or drop tensorboard from "
                                          "train.loggers)"]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("setting,message", [
    ("train.loggers=[csv, tensorbord]", "train.loggers: item [1]: expected one of 'csv', 'tensorboard', got "
                                        "'tensorbord' (did you mean tensorboard?)"),
    ("train.loggers=tensorboard", "train.loggers: expected a list of values among 'csv', 'tensorboard', got "
                                  "'tensorboard'"),
    ("train.log_every_n_steps=5", "train.log_every_n_steps: log_every_n_steps writes the step loss to TensorBoard, "
                                  "but train.loggers is [csv]; add tensorboard"),
    ("train.log_every_n_steps=0", "train.log_every_n_steps: expected a positive integer, got 0"),
])
def test_bad_logger_settings_are_refused_with_their_place(tmp_path, setting, message):
    cfg = spiral_config(tmp_path)
    r = run_cli("check", cfg, "--set", setting)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_hyperparameters_flatten_the_config_by_key_path():
    raw = {"seed": 1, "model": [{"type": "Linear", "units": 4}, "ReLU"], "optimizer": {"type": "SGD"},
           "train": {"metrics": ["f1", "mae"], "early_stopping": None, "shuffle": False}}
    assert tensorboard.hyperparameters(raw) == {
        "seed": 1, "model[0].type": "Linear", "model[0].units": 4, "model[1]": "ReLU", "optimizer.type": "SGD",
        "train.metrics": "['f1', 'mae']", "train.shuffle": False}


def test_a_run_that_fails_in_its_first_epoch_leaves_no_directory_behind_its_event_file(tmp_path):
    cfg = tmp_path / "tb.yaml"
    cfg.write_text(_config(tmp_path).replace("learning_rate: 0.5", "learning_rate: 1.0e+30"))
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 1 and "epoch 1" in r.err, r.err
    assert list((tmp_path / "runs").iterdir()) == []  # its event file (steps only) went with it


def test_the_step_loss_of_a_full_batch_run_is_its_epochs_training_loss(tmp_path):
    # one batch an epoch, no regularizer: step s is epoch s, and its batch's loss is the epoch's train_loss
    cfg = tmp_path / "tb.yaml"
    cfg.write_text(spiral_config(tmp_path, epochs=5, batch_size="null").read_text().replace(
        "train: {", "train: {loggers: [tensorboard], log_every_n_steps: 1, "))
    tags = _same_as_metrics_csv(train(cfg, tmp_path / "runs"), 5)
    assert [s for s, _ in tags["step_loss"]] == [1, 2, 3, 4, 5]
    assert [v for _, v in tags["step_loss"]] == pytest.approx([v for _, v in tags["train_loss"]], rel=1e-6)
