"""The training step never makes the host wait for the GPU, checked without a GPU.

Each case of tests/gpu_step_cases.py (every model part with a GPU branch, every registered loss,
optimizer, regularizer and metric, clipping) runs its step on tests/device_emulation.py's
stand-in for CuPy, with every fused kernel emulated: a device-to-host read (float, int, bool,
item, asnumpy, get) or a call that CuPy answers only after reading the device (bincount,
nonzero, x[mask], ...) inside the step fails the test, naming what waited.
tests/backend/test_gpu.py checks the same cases on a real device.
"""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from device_emulation import (DeviceArray, FAKE_CUPY, HostRead, clear_numpy_dispatches, emulated_gpu, no_host_reads,
                              numpy_dispatches)
from gpu_step_cases import STEP_CASES, covered
from kernel_emulation import emulate


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_train_step_reads_nothing_back_from_the_device(case, monkeypatch):
    clear_numpy_dispatches()
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch) as calls:
        trainer, callbacks = STEP_CASES[case].build(gpu)
        sums = trainer.tracker.zeros()
        step = trainer.training_step
        x, y = STEP_CASES[case].batch(np.random.default_rng(0))
        xb, yb = gpu.asarray(x), gpu.asarray(y)
        trainer.fast_mode(True)
        step(xb, yb, callbacks, sums=sums)  # the first step may check what it likes
        before = {n: p.data.copy() for n, p in trainer.model.named_parameters()}
        with no_host_reads():
            loss_total, correct = step(xb, yb, callbacks, sums=sums)
        assert isinstance(loss_total, DeviceArray)  # device scalars
        assert isinstance(correct, DeviceArray) if trainer.classification else correct == 0
        assert trainer.step == 2
        changed = [n for n, p in trainer.model.named_parameters()
                   if p.trainable and not np.array_equal(p.data, before[n])]
        assert changed, "the step updated no parameter"
    assert calls, "the step ran no emulated kernel: it did not take the GPU branches"
    assert not numpy_dispatches(), f"device arrays went through numpy's ufunc dispatch at {numpy_dispatches()}"


def test_the_cases_cover_every_registered_loss_optimizer_regularizer_and_metric():
    seen = covered()
    for kind in seen:
        missing = set(getattr(registry, kind).names()) - seen[kind]
        assert not missing, f"no GPU step case uses the {kind} {sorted(missing)}: add one to tests/gpu_step_cases.py"


SCALAR_READS = {"float": float, "int": int, "bool": bool, "item": lambda a: a.item(), "format": lambda a: f"{a}"}
ARRAY_READS = {"get": lambda a: a.get(), "asnumpy": FAKE_CUPY.asnumpy, "mask": lambda a: a[a > 0],
               "bincount": lambda a: FAKE_CUPY.bincount(a.astype(np.int64)), "nonzero": FAKE_CUPY.nonzero,
               "where(cond)": lambda a: FAKE_CUPY.where(a > 0), "unique": FAKE_CUPY.unique,
               "synchronize": lambda a: FAKE_CUPY.cuda.Device().synchronize()}


@pytest.mark.parametrize("read", list(SCALAR_READS) + list(ARRAY_READS))
def test_the_stand_in_refuses_every_kind_of_host_read(read, monkeypatch):
    with emulated_gpu(monkeypatch) as gpu:
        a = gpu.asarray(np.arange(3.0))
        total = a.sum()
        assert isinstance(total, DeviceArray) and total.shape == ()  # a reduction stays on the device, as in CuPy
        assert isinstance(a[1], DeviceArray) and isinstance(a * 2 + 1, DeviceArray)
        arg, f = (total, SCALAR_READS[read]) if read in SCALAR_READS else (a, ARRAY_READS[read])
        f(arg)  # allowed outside the step
        with no_host_reads(), pytest.raises(HostRead, match="the host waits for the device"):
            f(arg)


def test_the_epoch_copies_of_the_non_finite_guard_live_in_page_locked_host_memory(monkeypatch):
    """The guard copies the weights and optimizer state at each epoch's start so that a
    non-finite epoch can be undone. On the GPU those copies go to page-locked host memory: the
    GPU holds no second copy of the model, and the mark queues its copies without waiting."""
    from device_emulation import _Pinned
    from dlrun.training.faults import NonFiniteGuard

    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        case = STEP_CASES["mlp+batchnorm+dropout, Adam, L2, clip_norm"]
        trainer, callbacks = case.build(gpu)
        x, y = case.batch(np.random.default_rng(0))
        xb, yb = gpu.asarray(x), gpu.asarray(y)
        step = trainer.training_step
        step(xb, yb, callbacks, sums=trainer.tracker.zeros())  # the optimizer's state exists now
        guard = NonFiniteGuard(trainer)
        with no_host_reads():
            guard.mark()
        copies = guard.params + guard.optim
        assert copies and all(type(c) is np.ndarray and isinstance(c.base, _Pinned) for c in copies)
        marked = {n: np.array(p.data) for n, p in trainer.model.named_parameters()}
        state = [np.array(a) for a in guard._optim()]
        step(xb, yb, callbacks, sums=trainer.tracker.zeros())
        assert any(not np.array_equal(p.data, marked[n]) for n, p in trainer.model.named_parameters())
        guard.restore()
        for n, p in trainer.model.named_parameters():
            np.testing.assert_array_equal(p.data, marked[n], err_msg=n)
        for live, saved in zip(guard._optim(), state):
            np.testing.assert_array_equal(live, saved)


def test_the_guards_finiteness_check_on_the_gpu_finds_a_nan_in_any_block(monkeypatch):
    """On the GPU the end-of-epoch check sums the flat weights' squares a block at a time (a dot
    of the whole buffer took a copy of it): a NaN or an inf in any block is found."""
    from dlrun.training import faults

    monkeypatch.setattr(faults, "_BLOCK", 7)  # several blocks, the last one short
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        trainer, _ = STEP_CASES["mlp+batchnorm+dropout, Adam, L2, clip_norm"].build(gpu)
        guard = faults.NonFiniteGuard(trainer)
        flat = guard._params[0]
        assert guard._one_flat and flat.size > 3 * 7
        assert guard.healthy(0.5)
        for where, bad in ((0, np.nan), (flat.size // 2, np.inf), (flat.size - 1, -np.inf)):
            keep = float(flat[where])
            flat[where] = bad
            assert not guard.healthy(0.5), (where, bad)
            flat[where] = keep
        assert guard.healthy(0.5)
