"""An epoch on the GPU reads its values back from the device once, checked without a GPU.

Each read from the device (``float(x)``, ``x.get()``, ``asnumpy``, a synchronisation) makes the
host wait until the GPU has finished everything queued before it; for a small network an epoch's
steps take less time than a handful of those waits. So an epoch gathers every value it reports
(the loss and accuracy sums, the regularizers' penalty, the non-finite guard's sum over the
weights, the validation sums, the train.metrics sums) into one device vector and reads it with
one transfer; the best state is copied into page-locked host memory without waiting, and the
host waits for the device once more only when a checkpoint is written to disk.

These tests train shipped configs on tests/device_emulation.py's stand-in for CuPy, which
lists every read, and count the reads of each epoch.
"""
from __future__ import annotations

import numpy as np
import pytest

import dlrun.backend.backend as backend_module
from dlrun.backend import CPU, get_backend, gpu_available
from dlrun.config import load_config
from dlrun.runs import checkpoint, run
from dlrun.training.hooks import Callback
from conftest import CONFIGS
from device_emulation import FAKE_CUPY, counting_host_reads, emulated_gpu
from kernel_emulation import emulate


class EpochSpans(Callback):
    """Where each epoch's reads start in the stand-in's list (at this callback's on_epoch_begin,
    so an epoch's span holds its batches, its end and every callback of it)."""

    def __init__(self, log):
        self.log, self.starts, self.end = log, {}, None

    def on_epoch_begin(self, epoch, batches):
        self.starts[epoch] = len(self.log)

    def on_epoch_end(self, epoch, metrics):
        self.end = len(self.log)

    def reads(self) -> dict[int, list]:
        epochs = sorted(self.starts)
        bounds = [self.starts[e] for e in epochs[1:]] + [self.end]
        return {e: self.log[self.starts[e]:stop] for e, stop in zip(epochs, bounds)}


def _where(read) -> str:
    what, stack = read
    ours = [f"{f.filename.rsplit('dlrun/', 1)[-1]}:{f.lineno} {f.name}" for f in stack if "/dlrun/" in f.filename]
    return f"{what} at " + " <- ".join(ours[::-1][:4])


# small runs with everything that reports a value each epoch: validation, train.metrics, a
# regularizer, a best checkpoint (the monitor improves most epochs), a learning-rate schedule,
# early stopping that keeps the best weights, checkpoints every 2 epochs
COMMON = ["train.epochs=6", "train.checkpoint_every=2"]
CASES = {
    "iris: batches, f1 and top-k metrics, L2, per-step cosine, early stopping": (
        "iris.yaml", ["train.metrics=[f1, {type: top_k_accuracy, k: 2}]", "regularizer={type: L2, strength: 1.0e-3}",
                      "train.schedule={type: cosine}", "train.schedule_interval=step",
                      "train.early_stopping={monitor: val_loss, patience: 3, restore_best_weights: true}"]),
    "spiral: full batch, L2, monitor val_accuracy, plateau schedule": (
        "spiral.yaml", ["train.validation_split=0.2", "train.monitor=val_accuracy",
                        "train.schedule={type: reduce_on_plateau, monitor: val_loss, patience: 1}"]),
    "regression: mae metric, L1, step decay": (
        "regression.yaml", ["train.metrics=[mae]", "regularizer={type: L1, strength: 1.0e-4}",
                            "train.schedule={type: step, step_size: 2}"]),
    "moons_dropout: a layer that draws random numbers": ("moons_dropout.yaml", []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_epoch_on_the_gpu_reads_from_the_device_once(case, monkeypatch, tmp_path):
    name, overrides = CASES[case]
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch), counting_host_reads() as log:
        monkeypatch.setattr(backend_module, "_gpu", gpu)
        config = load_config(CONFIGS / name, overrides=["device=gpu", *COMMON, *overrides])
        spans = EpochSpans(log)
        result = run.train(config, runs_dir=tmp_path, callbacks=[spans])
    rows = result.history.rows
    assert len(rows) == 6 and all(r["val_loss"] is not None for r in rows)
    every = config.train.checkpoint_every
    for epoch, reads in list(spans.reads().items())[1:]:  # (the first step checks the layers' contracts)
        # one transfer for the epoch's values; one wait more where a checkpoint is written
        allowed = 1 + (epoch % every == 0)
        assert len(reads) <= allowed, (f"epoch {epoch} read from the device {len(reads)} times (at most {allowed}):\n"
                                       + "\n".join(_where(r) for r in reads))
    best = checkpoint.read(result.run_dir / "checkpoints" / "best.npz")
    assert best.meta["best"]["epoch"] == result.summary["best"]["epoch"]  # the queued copies were written


class Weights(Callback):
    """The weights and optimizer state at each epoch's end (read here, after the writer's turn)."""

    def __init__(self):
        self.at = {}

    def on_train_begin(self, trainer):
        self.trainer = trainer

    def on_epoch_end(self, epoch, metrics):
        t = self.trainer
        self.at[epoch] = ({k: np.array(v) for k, v in t.model.state_arrays().items()},
                          {k: np.array(t.backend.to_host(v)) for k, v in t.optimizer.state_dict().items()})


@pytest.mark.parametrize("device", ["emulated", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")])])
def test_checkpoints_written_from_queued_copies_hold_the_state_of_their_epoch(device, monkeypatch, tmp_path):
    """best.npz holds the state of the best epoch, not of the later epochs that ran after its
    copies were queued; last.npz the state of the epoch it was written at."""
    overrides = ["device=gpu", "train.epochs=5", "train.checkpoint_every=3", "optimizer={type: Adam, learning_rate: 0.2}"]
    weights = Weights()
    config = load_config(CONFIGS / "iris.yaml", overrides=overrides)
    if device == "cuda":
        result = run.train(config, runs_dir=tmp_path, callbacks=[weights])
    else:
        with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
            monkeypatch.setattr(backend_module, "_gpu", gpu)
            result = run.train(config, runs_dir=tmp_path, callbacks=[weights])
    best_epoch = result.summary["best"]["epoch"]
    assert best_epoch not in (3, 5)  # written with a later last.npz, not at its own epoch
    for file in ("best.npz", "last.npz"):
        ckpt = checkpoint.read(result.run_dir / "checkpoints" / file)
        model, optim = weights.at[ckpt.meta["epoch"]]
        assert ckpt.meta["epoch"] == (best_epoch if file == "best.npz" else 5)
        for k in model:
            np.testing.assert_array_equal(ckpt.model[k], model[k], err_msg=f"{file} {k}")
        for k in optim:
            np.testing.assert_array_equal(ckpt.optimizer[k], optim[k], err_msg=f"{file} {k}")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_read_back_gives_every_value_on_the_device():
    gpu = get_backend("gpu")
    values = [gpu.asarray(np.float32(2.5)), gpu.zero(np.int64) + 7, None, 0.25, gpu.asarray(np.arange(3.0))]
    got = gpu.read_back(values)
    assert got[:4] == [2.5, 7.0, None, 0.25] and all(type(g) is float for g in (got[0], got[1], got[3]))
    assert got[4].tolist() == [0.0, 1.0, 2.0] and got[4].dtype == np.float64


def test_read_back_gives_every_value_from_one_transfer(monkeypatch):
    values = [np.float64(2.5), np.int64(7), None, 0.25, np.array([1.0, 2.0, 3.0])]
    expected = [2.5, 7.0, None, 0.25, [1.0, 2.0, 3.0]]
    with emulated_gpu(monkeypatch) as gpu:
        on_device = [gpu.asarray(v) if isinstance(v, np.generic | np.ndarray) else v for v in values]
        on_device[0] = FAKE_CUPY.asarray(np.float32(2.5))  # mixed dtypes come back as float64
        with counting_host_reads() as log:
            got = gpu.read_back(on_device)
    assert len(log) == 1, [r[0] for r in log]
    for backend_got in (got, CPU.read_back(values)):
        assert [None if g is None else np.asarray(g).tolist() for g in backend_got] == expected
        assert all(type(g) is float for g in backend_got[:2])
        assert backend_got[4].dtype == np.float64
