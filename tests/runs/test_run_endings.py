"""A run's ending is never lost: a signal as training finishes, a resume of a run whose ending was
lost, a plugin that exits, two processes in one run directory, and temporary files of killed writes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from checkpoint_helpers import metrics_rows, spiral_config, summary, train
from conftest import ROOT, run_cli, write
from dlrun.runs import checkpoint, rundir, run
from dlrun.config import load_config
from dlrun.training.hooks import Callback

COMPARED = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "final_train_loss", "final_train_accuracy",
            "epochs", "best")


class SignalAfterEpoch(Callback):
    """Sends ``signum`` to this process when epoch ``epoch`` has ended (after its metrics row)."""

    def __init__(self, epoch: int, signum: int):
        self.epoch, self.signum = epoch, signum

    def on_epoch_end(self, epoch, metrics):
        if epoch == self.epoch:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_last_epoch_lets_the_run_finish(tmp_path, signum):
    straight = train(spiral_config(tmp_path, epochs=3), tmp_path / "a")
    cfg = load_config(spiral_config(tmp_path, epochs=3))
    result = run.train(cfg, tmp_path / "b", callbacks=[SignalAfterEpoch(3, signum)])
    assert result.signal == signum
    (done,) = (tmp_path / "b").iterdir()
    s = summary(done)
    assert {k: s[k] for k in COMPARED} == {k: summary(straight)[k] for k in COMPARED}
    assert checkpoint.read(done / "checkpoints" / "last.npz").meta.get("interrupted") is None
    assert len(metrics_rows(done)) == 3


def test_a_signal_before_the_last_epoch_still_stops_at_the_end_of_its_epoch(tmp_path):
    cfg = load_config(spiral_config(tmp_path, epochs=3))
    with pytest.raises(Exception) as e:
        run.train(cfg, tmp_path / "b", callbacks=[SignalAfterEpoch(2, signal.SIGTERM)])
    assert e.value.exit_code == 143 and "training stopped at the end of epoch 2" in e.value.message
    (done,) = (tmp_path / "b").iterdir()
    assert not (done / "summary.json").exists() and len(metrics_rows(done)) == 2


def test_a_signal_while_summary_json_is_written_does_not_cut_it(tmp_path, monkeypatch):
    write_json = rundir.write_json

    def signalled(path, data):
        os.kill(os.getpid(), signal.SIGTERM)  # (a second one too: neither may cut the ending)
        os.kill(os.getpid(), signal.SIGTERM)
        write_json(path, data)

    monkeypatch.setattr(rundir, "write_json", signalled)
    result = run.train(load_config(spiral_config(tmp_path, epochs=2)), tmp_path / "b")
    assert result.signal == signal.SIGTERM and summary(result.run_dir)["epochs"] == 2


LAST_BATCH_SIGNAL = '''\
import os
import signal

from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class SignalAtTheEnd(Layer):
    """y = x; sends SIGTERM to its process during the forward pass of call ``at``."""

    def __init__(self, at: int = 1):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return x

    def backward(self, dy):
        return dy
'''


def test_the_command_reports_a_signal_that_came_as_training_finished(tmp_path):
    """Through the CLI: SIGTERM in the last batch of the last epoch (full batch, 3 epochs: the
    first step's checks call forward once more, so call 4 is the last epoch's)."""
    plugin = write(tmp_path / "sig.py", LAST_BATCH_SIGNAL)
    cfg = write(tmp_path / "c.yaml", "seed: 0\ndata: {type: spiral, points_per_class: 10}\n"
                                     "model: [{type: Linear, units: 3}, {type: SignalAtTheEnd, at: 4}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: SGD\n"
                                     "train: {epochs: 3, batch_size: null, validation_split: 0}\n")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", "--plugin", plugin, process=True)  # (signals it)
    assert r.code == 143, r.err
    assert "SIGTERM received as training finished; the run is complete" in r.err, r.err
    (done,) = (tmp_path / "runs").iterdir()
    assert summary(done)["epochs"] == 3 and str(done) in r.out


def test_resume_finishes_a_run_whose_ending_was_lost(tmp_path):
    cfg = spiral_config(tmp_path, epochs=3)
    straight = train(cfg, tmp_path / "a")
    lost = train(cfg, tmp_path / "b")
    (lost / "summary.json").unlink()  # as a kill during the ending left it
    r = run_cli("train", "--resume", lost)
    assert r.code == 0, r.err
    s = summary(lost)
    assert {k: s[k] for k in COMPARED} == {k: summary(straight)[k] for k in COMPARED}
    assert s["resumed_from_epoch"] == 3
    best, kept = checkpoint.read(lost / "checkpoints" / "best.npz"), checkpoint.read(straight / "checkpoints" / "best.npz")
    assert best.meta["best"] == kept.meta["best"]
    assert all((best.model[k] == kept.model[k]).all() for k in kept.model)
    assert metrics_rows(lost) == metrics_rows(straight)
    r = run_cli("train", "--resume", lost)  # finished now: nothing more to do
    assert r.code == 2 and "has already trained 3 of 3 epochs" in r.err, r.err



def test_a_resume_of_a_config_without_a_name_leaves_config_yaml_as_training_wrote_it(tmp_path):
    """A config without `name:` (the run is named after its file): --resume wrote `name: run` into
    config.yaml, which the checkpoint's config lacks; after a resume that finished a run whose
    summary.json was lost (and writes no checkpoint), every later --resume warned that config.yaml
    had been edited by hand."""
    cfg = write(tmp_path / "sp.yaml", "seed: 0\ndata: {type: spiral, points_per_class: 20}\n"
                                      "model: [{type: Linear, units: 3}]\nloss: SoftmaxCrossEntropy\n"
                                      "optimizer: SGD\ntrain: {epochs: 2, batch_size: 20}\n")
    run_dir = train(cfg, tmp_path / "runs")
    written = (run_dir / "config.yaml").read_text()
    (run_dir / "summary.json").unlink()
    r = run_cli("train", "--resume", run_dir)
    assert r.code == 0 and (run_dir / "summary.json").is_file(), r.err
    assert (run_dir / "config.yaml").read_text() == written
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=3")
    assert r.code == 0 and "warning" not in r.err, r.err
    assert "name:" not in (run_dir / "config.yaml").read_text()
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=4")
    assert r.code == 0 and "warning" not in r.err, r.err


QUITTER = '''\
import os
import sys

from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Quitter(Layer):
    """y = x; its forward ends the process at call ``at`` (its backward raises KeyboardInterrupt at
    call ``interrupt_at``)."""

    def __init__(self, at: int = 0, interrupt_at: int = 0):
        super().__init__()
        self.at, self.interrupt_at, self.calls, self.back = at, interrupt_at, 0, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at or os.environ.get("QUIT_NOW"):
            sys.exit(0)
        return x

    def backward(self, dy):
        self.back += 1
        if self.back == self.interrupt_at:
            raise KeyboardInterrupt
        return dy
'''


def _quitter_config(tmp_path, options: str):
    return write(tmp_path / "q.yaml", "seed: 0\ndata: {type: spiral, points_per_class: 20}\n"
                                      f"model: [{{type: Linear, units: 3}}, {{type: Quitter, {options}}}]\n"
                                      "loss: SoftmaxCrossEntropy\noptimizer: SGD\n"
                                      "train: {epochs: 4, batch_size: 6, validation_split: 0}\n")


def test_a_plugin_that_calls_sys_exit_while_loading_is_an_error(tmp_path):
    plugin = write(tmp_path / "bye.py", "import sys\n\nsys.exit(0)\n")
    r = run_cli("list", "layers", "--plugin", plugin)
    assert r.code == 2 and "bye.py:3: plugin called sys.exit(0)" in r.err and "Traceback" not in r.err, r.err


@pytest.mark.parametrize("options,what,line", [
    ("at: 20", "forward called sys.exit(0)", 20),
    ("interrupt_at: 15", "backward raised KeyboardInterrupt", 26),
])
def test_a_plugin_that_exits_during_training_fails_the_run_and_keeps_its_state(tmp_path, options, what, line):
    """10 batches an epoch: the call at 20 or 15 comes in epoch 2 (the first step checks one
    more forward), so epoch 1's state is kept and the run resumes from it."""
    plugin = write(tmp_path / "quit.py", QUITTER)
    cfg = _quitter_config(tmp_path, options)
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", "--plugin", plugin)
    assert r.code == 1, (r.code, r.err)
    assert f"the layer 'Quitter': {what}" in r.err and f"(quit.py:{line})" in r.err, r.err
    (done,) = (tmp_path / "runs").iterdir()
    assert "the last good checkpoint (epoch 1) is" in r.err and not (done / "summary.json").exists()
    assert checkpoint.read(done / "checkpoints" / "last.npz").meta["epoch"] == 1
    r = run_cli("train", "--resume", done, "--plugin", plugin, "--set", "model[1].at=0", "--set",
                "model[1].interrupt_at=0")
    assert r.code == 0 and summary(done)["epochs"] == 4, r.err


def test_a_plugin_that_calls_sys_exit_in_predict_is_an_error(tmp_path):
    plugin = write(tmp_path / "quit.py", QUITTER)
    done = train(_quitter_config(tmp_path, "at: 0"), tmp_path / "runs", "--plugin", plugin)
    write(tmp_path / "x.csv", "0.1,0.2\n")
    r = run_cli("predict", done, "--input", tmp_path / "x.csv", "--plugin", plugin, env={"QUIT_NOW": "1"})
    assert r.code == 1 and "the layer 'Quitter': forward called sys.exit(0)" in r.err and "quit.py:20" in r.err, r.err


def test_one_process_trains_in_a_run_directory_at_a_time(tmp_path):
    done = train(spiral_config(tmp_path, epochs=2), tmp_path / "runs")
    rows = (done / "metrics.csv").read_text()
    with rundir.RunLock(done):
        r = run_cli("train", "--resume", done, "--set", "train.epochs=4")
    assert r.code == 2 and f"is in use by process {os.getpid()}" in r.err and len(r.err.splitlines()) == 1, r.err
    assert (done / "metrics.csv").read_text() == rows
    # a lock left by a killed process does not block: the system released it with the process
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from dlrun.runs.rundir import RunLock; RunLock(Path(sys.argv[1])).__enter__(); "
                               "print('locked', flush=True); time.sleep(60)", str(done)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait()
    r = run_cli("train", "--resume", done, "--set", "train.epochs=4")
    assert r.code == 0 and len(metrics_rows(done)) == 4, r.err


def test_resume_removes_the_temporary_files_of_killed_checkpoint_writes(tmp_path):
    done = train(spiral_config(tmp_path, epochs=2), tmp_path / "runs")
    left = [done / "checkpoints" / ".last.npz.tmp-999999", done / "checkpoints" / ".best.npz.tmp-12",
            done / ".summary.json.tmp", done / ".metrics.csv.tmp"]
    for p in left:
        p.write_bytes(b"\0" * 1000)
    keep = write(done / "checkpoints" / "notes.txt", "mine")
    r = run_cli("train", "--resume", done, "--set", "train.epochs=3")
    assert r.code == 0, r.err
    assert not any(p.exists() for p in left) and keep.exists()
    assert json.loads((done / "summary.json").read_text())["epochs"] == 3


def test_a_signal_the_parent_ignores_stays_ignored_while_training(tmp_path):
    """Under nohup (SIGTERM ignored by the parent) a SIGTERM in the middle of training changes
    nothing: the run goes to its end (training's handlers used to take over the ignored signal)."""
    plugin = write(tmp_path / "sig.py", LAST_BATCH_SIGNAL)
    cfg = write(tmp_path / "c.yaml", "seed: 0\ndata: {type: spiral, points_per_class: 10}\n"
                                     "model: [{type: Linear, units: 3}, {type: SignalAtTheEnd, at: 2}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: SGD\n"
                                     "train: {epochs: 3, batch_size: null, validation_split: 0}\n")
    p = subprocess.run([sys.executable, "-m", "dlrun", "train", str(cfg), "--runs-dir", str(tmp_path / "runs"),
                        "--plugin", str(plugin)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)},
                       preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    assert p.returncode == 0, p.stderr
    (done,) = (tmp_path / "runs").iterdir()
    assert summary(done)["epochs"] == 3


def test_evaluate_takes_a_data_spec_too_long_to_be_a_file_name(tmp_path):
    done = train(spiral_config(tmp_path, epochs=1), tmp_path / "runs")
    r = run_cli("evaluate", done, "--data", "{type: spiral, seed: 7" + " " * 300 + "}")
    assert r.code == 0 and "accuracy" in r.out, r.err


EVAL_EXIT = '''\
import sys

from dlrun.api import Layer, layers


@layers.register()
class EvalExit(Layer):
    """y = x; its evaluation-mode forward ends the process on call ``at`` (validation)."""

    def __init__(self, at: int = 0):
        super().__init__()
        self.at, self.evals = at, 0

    def forward(self, x):
        if not self.training:
            self.evals += 1
            if self.evals == self.at:
                sys.exit(3)
        return x

    def backward(self, dy):
        return dy
'''


def test_code_that_exits_in_validation_leaves_no_epoch_without_its_metrics_row(tmp_path):
    """sys.exit in epoch 2's validation: the checkpoint said 2 epochs were done, metrics.csv had
    one row, and the resumed run never recorded epoch 2. The epoch is now undone, as one that
    raised in a batch, and the resumed run equals a straight one."""
    plugin = write(tmp_path / "evalexit.py", EVAL_EXIT)
    text = ("seed: 0\ndata: {type: spiral, points_per_class: 20}\n"
            "model: [{type: Linear, units: 3}, {type: EvalExit, at: AT}]\nloss: SoftmaxCrossEntropy\n"
            "optimizer: {type: SGD, momentum: 0.9}\ntrain: {epochs: 4, batch_size: 10, validation_split: 0.25}\n")
    straight = train(write(tmp_path / "s.yaml", text.replace("AT", "0")), tmp_path / "a", "--plugin", plugin)
    r = run_cli("train", write(tmp_path / "c.yaml", text.replace("AT", "3")), "--runs-dir", tmp_path / "b",
                "--plugin", plugin)  # 2 validation batches an epoch: call 3 is epoch 2's
    assert r.code == 1 and "forward called sys.exit(3)" in r.err and "checkpoint (epoch 1)" in r.err, r.err
    (done,) = (tmp_path / "b").iterdir()
    assert checkpoint.read(done / "checkpoints" / "last.npz").meta["epoch"] == 1 and len(metrics_rows(done)) == 1
    r = run_cli("train", "--resume", done, "--plugin", plugin, "--set", "model[1].at=0")
    assert r.code == 0, r.err
    assert [row["epoch"] for row in metrics_rows(done)] == ["1", "2", "3", "4"]
    a, b = (checkpoint.read(d / "checkpoints" / "last.npz").model for d in (straight, done))
    assert all((a[k] == b[k]).all() for k in a)
