"""Training faults: NaN diagnosis, SIGINT/SIGTERM checkpoints, kills mid-write, full disks."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, run_cli, write
from dlrun.runs import checkpoint

PLUGIN = ROOT / "tests/corpus/plugins/faulty.py"
DATA = "data: {type: spiral, classes: 2, points_per_class: 12}\n"
TAIL = "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.1}\n"


def _config(tmp_path, model: str, train: str) -> str:
    return str(write(tmp_path / "c.yaml", f"plugins: [{PLUGIN}]\nseed: 1\n{DATA}model:\n{model}{TAIL}train: {train}\n"))


def test_nan_in_backward_names_the_layer(tmp_path):
    cfg = _config(tmp_path, "  - {type: Linear, units: 4}\n  - NaNBackward\n  - {type: Linear, units: 2}\n",
                  "{epochs: 3, batch_size: 8}")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 1, r.err
    assert "epoch 1, batch 1: model[1] NaNBackward() produced NaN in backward (dx" in r.err
    assert "no epoch finished" in r.err and "Traceback" not in r.err
    assert not list((tmp_path / "runs").glob("*/checkpoints/last.npz"))  # nothing non-finite was saved
    assert list((tmp_path / "runs").iterdir()) == []  # and no run directory with only config.yaml in it


def test_nan_in_forward_names_epoch_batch_and_keeps_last_good_checkpoint(tmp_path):
    # 24 samples, batch 8: 3 batches per epoch; training forward call 5 is epoch 2, batch 2
    cfg = _config(tmp_path, "  - {type: Linear, units: 4}\n  - {type: NaNForwardAt, call: 5}\n"
                            "  - {type: Linear, units: 2}\n", "{epochs: 4, batch_size: 8}")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 1, r.err
    assert "epoch 2, batch 2: model[1] NaNForwardAt(call=5) produced NaN in forward" in r.err
    assert "last good checkpoint (epoch 1)" in r.err and "Traceback" not in r.err
    (ckpt,) = (tmp_path / "runs").glob("*/checkpoints/last.npz")
    model, _, meta = checkpoint.load(ckpt)
    assert meta["epoch"] == 1
    assert all(np.isfinite(a).all() for a in model.values())


def test_overflowing_learning_rate_names_the_first_infinite_output(tmp_path):
    cfg = _config(tmp_path, "  - {type: Linear, units: 4}\n  - ReLU\n  - {type: Linear, units: 2}\n",
                  "{epochs: 5, batch_size: 8}")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", "--set", "optimizer.learning_rate=1e30")
    assert r.code == 1, r.err
    assert "produced inf in forward" in r.err or "the optimizer step made" in r.err
    assert "Traceback" not in r.err and "RuntimeWarning" not in r.err


def _start_training(tmp_path, batch_size=4, extra_env=None):
    cfg = write(tmp_path / "long.yaml", "seed: 0\ndata: {type: spiral, classes: 3, points_per_class: 100}\n"
                "model:\n  - {type: Linear, units: 32}\n  - ReLU\n  - {type: Linear, units: 3}\n" + TAIL +
                f"train: {{epochs: 100000, batch_size: {batch_size}}}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", **(extra_env or {}))
    p = subprocess.Popen([sys.executable, "-m", "dlrun", "train", str(cfg), "--runs-dir", str(tmp_path / "runs")],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:  # wait until a few epochs ran
        if line.startswith("epoch 3/"):
            break
    return p


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_checkpoint_and_prints_resume_command(tmp_path, sig, code):
    p = _start_training(tmp_path)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"resume with: dlrun train --resume {run_dir}" in err
    assert f"{sig.name} received: training stopped" in err and "Traceback" not in err
    model, optim, meta = checkpoint.load(run_dir / "checkpoints" / "last.npz")
    assert meta["interrupted"]["signal"] == sig.name and meta["epoch"] >= 3
    assert 0 < meta["interrupted"]["batches_done"] <= meta["interrupted"]["batches"] == 75
    assert set(model) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert not list(run_dir.glob("checkpoints/.*tmp*"))


SLOW_WRITE = r"""
import sys, time, io, numpy as np
from pathlib import Path
from dlrun.runs import checkpoint
real = np.savez
def slow_savez(f, **arrays):  # write half of the archive, then stall: the parent kills us here
    buf = io.BytesIO(); real(buf, **arrays); data = buf.getvalue()
    f.write(data[: len(data) // 2]); f.flush()
    Path(sys.argv[2]).write_text("writing"); time.sleep(60)
path = Path(sys.argv[1])
w = {"0.weight": np.full((200, 300), 1.5, np.float32)}
checkpoint.save(path, w, None, {"epoch": 1})
np.savez = slow_savez
checkpoint.save(path, {"0.weight": np.full((200, 300), 2.5, np.float32)}, None, {"epoch": 2})
"""


def test_sigkill_during_checkpoint_write_leaves_previous_checkpoint_loadable(tmp_path):
    path, marker = tmp_path / "ck" / "last.npz", tmp_path / "marker"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", SLOW_WRITE, str(path), str(marker)], env=env)
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), "the writer never reached the second save"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert list(path.parent.glob(".last.npz.tmp-*")), "the kill should have hit the write of the temporary file"
    model, _, meta = checkpoint.load(path)
    assert meta["epoch"] == 1 and np.all(model["0.weight"] == 1.5)


def _disk_full(monkeypatch, only=None):
    """np.savez refuses with ENOSPC (only for files whose name starts with ``only``, if given)."""
    real = np.savez

    def full(f, **arrays):
        if only is not None and not f.name.rsplit("/", 1)[-1].startswith(only):
            return real(f, **arrays)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.np, "savez", full)


def test_full_disk_gives_clear_error(tmp_path, monkeypatch):
    cfg = ROOT / "tests/corpus/configs/valid.yaml"
    _disk_full(monkeypatch)
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", process=False)  # (its numpy is the patched one)
    assert r.code == 1, r.err
    assert "No space left on device" in r.err and ".npz" in r.err and "Traceback" not in r.err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not list(run_dir.rglob("*tmp*"))  # the partial file was removed
    # the first checkpoint failed: nothing can be resumed, and the message says so (it claimed
    # "any earlier checkpoint is intact")
    assert "no checkpoint had been written yet, so the run cannot be resumed" in r.err


def test_a_disk_full_at_best_npz_leaves_a_resumable_run(tmp_path, monkeypatch):
    # best.npz was written before last.npz, so a disk that filled at the first checkpoint left a
    # best.npz, or nothing, and no last.npz to resume from
    cfg = ROOT / "tests/corpus/configs/valid.yaml"
    _disk_full(monkeypatch, only=".best")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", "--set", "train.validation_split=0.5",  # (best by val_loss)
                process=False)  # (its numpy is the patched one)
    assert r.code == 1 and "best.npz: No space left on device" in r.err, r.err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"is intact: once there is room, resume with: dlrun train --resume {run_dir}" in r.err
    monkeypatch.undo()  # room again
    # a learning rate below every ulp: epoch 2's val_loss equals epoch 1's, no strict improvement,
    # so only the resume itself can write epoch 1's best.npz
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=2", "--set", "optimizer.learning_rate=1e-30")
    assert r.code == 0, r.err
    assert (run_dir / "summary.json").is_file()
    # the resume wrote the best.npz the disk refused (epoch 1's state is last.npz's), or a better one
    best = checkpoint.read(run_dir / "checkpoints" / "best.npz").meta["best"]
    assert best == json.loads((run_dir / "summary.json").read_text())["best"]


def test_failed_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "last.npz"
    checkpoint.save(path, {"w": np.ones(3, np.float32)}, None, {"epoch": 1})

    def full(f, **arrays):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.np, "savez", full)
    with pytest.raises(OSError) as e:
        checkpoint.save(path, {"w": np.zeros(3, np.float32)}, None, {"epoch": 2})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    monkeypatch.undo()
    model, _, meta = checkpoint.load(path)
    assert meta["epoch"] == 1 and np.all(model["w"] == 1)
    assert [q.name for q in tmp_path.iterdir()] == ["last.npz"]
