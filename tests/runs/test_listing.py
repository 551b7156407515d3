"""`dlrun runs`: the table of runs (status, epochs, time, best and final monitored metric), robust
to run directories that are being written, interrupted, failed or damaged; `--diff` of configs."""
from __future__ import annotations

import json
import signal

import pytest

from checkpoint_helpers import spiral_config, summary, train
from conftest import run_cli, write
from dlrun.config import load_config
from dlrun.runs import listing, rundir, run
from dlrun.training.hooks import Callback
from test_run_endings import SignalAfterEpoch

STOPPING = "\ntrain: {epochs: 60, batch_size: 16, validation_split: 0.25, early_stopping: {monitor: val_loss, patience: 1}}\n"


def _record(runs, name_part):
    (rec,) = [r for r in listing.list_runs(runs) if name_part in r.name]
    return rec


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A runs directory with a finished run, one stopped early, an interrupted and a failed one."""
    tmp = tmp_path_factory.mktemp("runs")
    runs = tmp / "runs"
    train(spiral_config(tmp, name="done", epochs=3), runs)
    early = spiral_config(tmp, name="early", lr=2.0, epochs=60)
    write(early, early.read_text().split("\ntrain:")[0] + STOPPING)
    train(early, runs)
    cfg = load_config(spiral_config(tmp, name="stopped", epochs=5))
    with pytest.raises(Exception) as e:
        run.train(cfg, runs, callbacks=[SignalAfterEpoch(2, signal.SIGTERM)])
    assert e.value.exit_code == 143
    cfg = load_config(spiral_config(tmp, name="crashed", epochs=5))
    with pytest.raises(RuntimeError):
        run.train(cfg, runs, callbacks=[RaiseAfterEpoch()])
    return runs


class RaiseAfterEpoch(Callback):
    """Code that fails after epoch 2 (the run ends without its summary)."""

    def on_epoch_end(self, epoch, metrics):
        if epoch == 2:
            raise RuntimeError("a bug")


def test_each_run_gets_its_status_epochs_and_monitored_metric(runs):
    done = _record(runs, "done-")
    assert (done.status, done.epochs, done.planned, done.monitor) == ("finished", 3, 3, "val_loss")
    s = summary(done.path)
    assert done.best == s["best"]["value"] and done.best_epoch == s["best"]["epoch"]
    assert done.final == pytest.approx(s["val_loss"]) and done.seconds == s["seconds"]
    assert done.config == str(runs.parent / "done.yaml") and done.notes == []
    early = _record(runs, "early-")
    assert early.status == "stopped early" and early.epochs < early.planned == 60
    assert early.best_epoch == early.epochs - 1  # patience 1: it stopped one epoch after the best
    stopped = _record(runs, "stopped-")
    assert (stopped.status, stopped.epochs, stopped.planned) == ("interrupted", 2, 5)
    assert stopped.seconds > 0 and stopped.best is not None  # from metrics.csv and last.npz
    crashed = _record(runs, "crashed-")
    assert crashed.status == "failed" and crashed.epochs >= 1 and crashed.planned == 5


def test_the_table_shows_every_run(runs):
    r = run_cli("runs", runs)
    assert r.code == 0, r.err
    for name in ("done-", "early-", "stopped-", "crashed-"):
        assert name in r.out
    for word in ("finished", "stopped early", "interrupted", "failed", "3/3", "2/5", "val_loss"):
        assert word in r.out, word
    done = _record(runs, "done-")
    line = next(line for line in r.out.splitlines() if done.name in line)
    assert f"{done.best:.4g} @{done.best_epoch}" in line and f"{done.final:.4g}" in line


def test_sorting_by_a_column_and_did_you_mean_for_a_bad_one(runs):
    by_epochs = [r.epochs for r in listing.list_runs(runs, "epochs")]
    assert by_epochs == sorted(by_epochs)
    names = [r.name for r in listing.list_runs(runs, "run", reverse=True)]
    assert names == sorted(names, reverse=True)
    r = run_cli("runs", runs, "--sort", "epohcs")
    assert r.code == 2 and "did you mean epochs?" in r.err and r.err.count("\n") == 1
    out = run_cli("runs", runs, "--sort", "status").out
    assert out.index("failed") < out.index("finished") < out.index("interrupted")


def test_damaged_and_partial_run_directories_are_listed_not_fatal(tmp_path):
    runs = tmp_path / "runs"
    a = train(spiral_config(tmp_path, name="a", epochs=2), runs)
    (a / "summary.json").write_text("{not json")
    (a / "config.resolved.yaml").unlink()
    (a / "config.yaml").write_text("train: [unclosed\n")
    b = train(spiral_config(tmp_path, name="b", epochs=2), runs)
    (b / "summary.json").unlink()  # killed while writing its ending
    (b / "checkpoints" / "last.npz").write_bytes(b"PK\x03\x04 truncated")
    with open(b / "metrics.csv", "a") as f:
        f.write("3,0.5,")  # a row cut short
    c = runs / "c-20260101-120000"  # a run that wrote its config and nothing else yet
    c.mkdir()
    write(c / "config.yaml", "data: spiral\n")
    (runs / "not-a-run").mkdir()
    (runs / "stray.txt").write_text("x")
    r = run_cli("runs", runs)
    assert r.code == 0, r.err
    assert "not-a-run" not in r.out and "stray" not in r.out
    recs = {rec.name: rec for rec in listing.list_runs(runs)}
    assert set(recs) == {a.name, b.name, c.name}
    ra, rb, rc = recs[a.name], recs[b.name], recs[c.name]
    assert ra.status == "failed" and ra.epochs == 2 and ra.planned is None
    assert "summary.json unreadable" in ra.notes and "config.yaml unreadable" in ra.notes
    assert rb.status == "failed" and rb.epochs == 2 and "checkpoints/last.npz unreadable" in rb.notes
    assert rc.status == "failed" and rc.epochs is None and rc.planned == 10 and rc.started == "20260101-120000"
    assert "summary.json unreadable" in r.out  # the notes are shown under the table


def test_a_run_in_progress_is_running(tmp_path):
    d = train(spiral_config(tmp_path, epochs=1), tmp_path / "runs")
    with rundir.RunLock(d):
        assert listing.read_run(d).status == "running"
    assert listing.read_run(d).status == "finished"


def test_a_resumed_run_interrupted_again_is_interrupted_not_finished(tmp_path):
    d = train(spiral_config(tmp_path, epochs=2), tmp_path / "runs")
    cfg, ckpt = run.resume_config(d, ["train.epochs=5"])
    with pytest.raises(Exception):
        run.resume(d, cfg, ckpt, callbacks=[SignalAfterEpoch(3, signal.SIGTERM)])
    rec = listing.read_run(d)
    assert (rec.status, rec.epochs, rec.planned) == ("interrupted", 3, 5)
    assert json.loads((d / "summary.json").read_text())["epochs"] == 2  # the earlier ending's summary


def test_a_missing_runs_directory_is_a_usage_error(tmp_path):
    r = run_cli("runs", tmp_path / "nowhere")
    assert r.code == 2 and "no such directory" in r.err
    (tmp_path / "empty").mkdir()
    r = run_cli("runs", tmp_path / "empty")
    assert r.code == 0 and "no runs in" in r.out


def test_diff_shows_the_key_paths_that_differ(tmp_path):
    runs = tmp_path / "runs"
    a = train(spiral_config(tmp_path, epochs=2), runs)
    b = train(spiral_config(tmp_path, epochs=2), runs, "--set", "optimizer.learning_rate=0.25",
              "--set", "model[0].weight_initializer=he_uniform")
    path_a, path_b, diff = listing.config_diff(a, b)
    assert diff == [("model[0].weight_initializer.type", "he_normal", "he_uniform"),
                    ("optimizer.learning_rate", 0.5, 0.25)]
    r = run_cli("runs", runs, "--diff", a.name, b.name)  # names inside RUNS_DIR
    assert r.code == 0, r.err
    line = next(line for line in r.out.splitlines() if "optimizer.learning_rate" in line)
    assert "0.5" in line and "0.25" in line
    assert "the resolved configs of" in run_cli("runs", "--diff", a, a).out
    r = run_cli("runs", runs, "--diff", a.name, "spiral-nope")
    assert r.code == 2 and "not a run directory" in r.err


def test_diff_of_models_of_different_depths_marks_the_absent_keys(tmp_path):
    runs = tmp_path / "runs"
    a = train(spiral_config(tmp_path, epochs=1), runs)
    deeper = spiral_config(tmp_path, name="deeper", epochs=1)
    write(deeper, deeper.read_text().replace("  - ReLU\n", "  - ReLU\n  - {type: Linear, units: 8}\n  - Tanh\n"))
    b = train(deeper, runs)
    _, _, diff = listing.config_diff(a, b)
    keys = [k for k, _, _ in diff]
    assert ("model[2].units", 3, 8) in diff and ("model[3].type", listing.MISSING, "Tanh") in diff
    assert keys.index("model[2].units") < keys.index("model[3].type") < keys.index("model[4].units")
    assert ("name", "spiral", "deeper") in diff


def test_a_run_directory_the_system_refuses_to_read_is_listed_as_unreadable(tmp_path, monkeypatch):
    d = train(spiral_config(tmp_path, epochs=1), tmp_path / "runs")

    def refused(run_dir):
        raise PermissionError(13, "Permission denied", str(run_dir))

    monkeypatch.setattr(listing, "read_run", refused)  # (root reads every file: the refusal is simulated)
    (rec,) = listing.list_runs(tmp_path / "runs")
    assert rec.path == d and rec.status == "unreadable" and rec.notes == ["cannot read it: Permission denied"]
