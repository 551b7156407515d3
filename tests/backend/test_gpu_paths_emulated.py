"""The GPU code paths, run on the CPU with each CUDA kernel replaced by a numpy emulator of its
source (tests/kernel_emulation.py), agree with the CPU code paths.

This checks the Python side of every fused-kernel path without a GPU: the arguments each call
passes (order, dtypes, shapes), the buffers it reuses across batches of different sizes, and what
it does with the results. tests/test_kernels_compile.py checks that the CUDA source compiles,
and tests/test_gpu.py runs it on a device.
"""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import BLOCK_KERNELS, KERNELS
from dlrun.config import load_config
from dlrun.model import Sequential
from dlrun.runs.run import train
from conftest import CONFIGS
from kernel_emulation import BLOCK_EMULATORS, EMULATORS, Emulated, emulate, import_all_modules

import_all_modules()
DTYPES = (np.float32, np.float64)


def test_every_declared_kernel_has_an_emulator():
    assert set(EMULATORS) == {k.name for k in KERNELS}
    assert set(BLOCK_EMULATORS) == {k.name for k in BLOCK_KERNELS}


def _layer_run(spec, shape, x, dtype, training_buffers=False):
    layer = registry.layers.build(spec)
    Sequential([layer], shape, dtype=dtype, seed=0)
    layer.buffers.enabled = training_buffers
    rng = np.random.default_rng(1)
    outs = []
    for xb in x:  # two batches of different sizes: buffers must follow the shape
        y = layer.forward(xb.copy())
        dy = rng.standard_normal(y.shape).astype(dtype)
        dx = layer.backward(dy)
        outs.append((y.copy(), None if dx is None else dx.copy(),
                     {k: p.grad.copy() for k, p in layer.params.items() if p.grad is not None}))
    return outs


def _pool_input(n, rng, dtype):
    x = rng.standard_normal((n, 2, 6, 8)).astype(dtype)
    x[x < 0.3] = 0.0  # ties, as after a ReLU: the first in window order wins on both paths
    return x


LAYER_CASES = {
    "ReLU": ("ReLU", (5,), lambda n, rng, dt: rng.standard_normal((n, 5)).astype(dt), ["dlrun_relu"]),
    "GELU": ("GELU", (5,), lambda n, rng, dt: rng.standard_normal((n, 5)).astype(dt), ["dlrun_gelu"]),
    "MaxPool2D": ({"type": "MaxPool2D", "pool_size": 2}, (2, 6, 8), _pool_input, ["dlrun_maxpool"]),
    "MaxPool2D-3x2": ({"type": "MaxPool2D", "pool_size": [3, 2]}, (2, 6, 8), _pool_input, ["dlrun_maxpool"]),
    "Dropout": ({"type": "Dropout", "rate": 0.3}, (5,), lambda n, rng, dt: rng.standard_normal((n, 5)).astype(dt),
                ["dlrun_dropout"]),
    "Embedding": ({"type": "Embedding", "input_dim": 10, "output_dim": 4}, (5,),
                  lambda n, rng, dt: rng.integers(0, 10, (n, 5)).astype(dt), ["dlrun_embedding"]),
    "MultiHeadAttention": ({"type": "MultiHeadAttention", "heads": 2, "causal": True, "dropout": 0.3}, (5, 4),
                           lambda n, rng, dt: rng.standard_normal((n, 5, 4)).astype(dt), ["dlrun_dropout"]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_layer_gpu_path_matches_the_cpu_path(case, dtype, monkeypatch):
    spec, shape, make, kernels = LAYER_CASES[case]
    rng = np.random.default_rng(0)
    x = [make(4, rng, dtype), make(3, rng, dtype)]
    cpu = _layer_run(spec, shape, x, dtype, training_buffers=True)
    with emulate(monkeypatch) as calls:
        gpu = _layer_run(spec, shape, x, dtype, training_buffers=True)
    assert all(calls[k] == 2 for k in kernels), calls
    for (y0, dx0, g0), (y1, dx1, g1) in zip(cpu, gpu):
        assert y1.dtype == y0.dtype and y1.shape == y0.shape
        np.testing.assert_allclose(y1, y0, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(dx1, dx0, rtol=1e-6, atol=1e-7)
        assert g1.keys() == g0.keys()
        for k in g0:
            np.testing.assert_allclose(g1[k], g0[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["Dropout", "ReLU", "GELU", "MultiHeadAttention"])
def test_layer_gpu_path_without_training_buffers_matches_the_cpu_path(case, monkeypatch):
    """Outside the training loop (gradcheck, a plugin's own use) no buffer is given: a kernel
    with two outputs must still be passed both, or CuPy refuses the call."""
    spec, shape, make, kernels = LAYER_CASES[case]
    x = [make(4, np.random.default_rng(0), np.float64)]
    cpu = _layer_run(spec, shape, x, np.float64)
    with emulate(monkeypatch) as calls:
        gpu = _layer_run(spec, shape, x, np.float64)
    assert all(calls[k] == 1 for k in kernels), calls
    for a, b in zip(cpu[0][:2], gpu[0][:2]):
        np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-15)  # GELU: CUDA's erfc, not the CPU's


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", ["L1", "L2"])
def test_regularizer_gpu_gradient_matches_the_cpu_gradient(name, dtype, monkeypatch):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 5)).astype(dtype)
    w[0, :3] = 0.0, -0.0, np.nan  # sign(0) = 0 and sign(NaN) = NaN on both paths
    g = rng.standard_normal((6, 5)).astype(dtype)
    reg = registry.regularizers.build({"type": name, "strength": 0.3})
    cpu = g.copy()
    reg.add_gradient(w, cpu)
    with emulate(monkeypatch) as calls:
        gpu = g.copy()
        reg.add_gradient(w, gpu)
    assert calls[f"dlrun_{name.lower()}_grad"] == 1 and gpu.dtype == dtype
    np.testing.assert_array_equal(gpu, cpu)


NAN_POOLS = {  # the kernel each takes on GPU: disjoint windows one each way, others the NaN winners
    "2": ({"type": "MaxPool2D", "pool_size": 2}, "dlrun_maxpool", "dlrun_maxpool_grad"),
    "3x2": ({"type": "MaxPool2D", "pool_size": [3, 2]}, "dlrun_maxpool", "dlrun_maxpool_grad"),
    "3-stride-1": ({"type": "MaxPool2D", "pool_size": 3, "stride": 1}, "dlrun_maxpool_nan", None),
    "3-stride-2-pad-1": ({"type": "MaxPool2D", "pool_size": 3, "stride": 2, "padding": 1}, "dlrun_maxpool_nan", None),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", sorted(NAN_POOLS))
def test_maxpool_gpu_path_sends_nan_windows_gradient_to_their_last_nan(case, dtype, monkeypatch):
    """Windows with one or several NaNs: NaN out, and the gradient to the window's last NaN in
    row-major order (as PyTorch), on the GPU path as on the CPU path and as the reference says."""
    from kernel_emulation import reference

    spec, forward_kernel, backward_kernel = NAN_POOLS[case]
    rng = np.random.default_rng(3)
    x = [_pool_input(n, rng, dtype) for n in (4, 3)]
    for xb in x:
        xb[rng.random(xb.shape) < 0.15] = np.nan
    x[1][:] = np.where(np.isnan(x[1]), 0.0, x[1])  # a batch without NaN after one with them
    cpu = _layer_run(spec, (2, 6, 8), x, dtype, training_buffers=True)
    with emulate(monkeypatch) as calls:
        gpu = _layer_run(spec, (2, 6, 8), x, dtype, training_buffers=True)
    assert calls[forward_kernel] > 0 and (backward_kernel is None or calls[backward_kernel] == 2), calls
    layer = registry.layers.build(spec)
    Sequential([layer], (2, 6, 8), dtype=dtype, seed=0)
    dys = np.random.default_rng(1)
    for xb, (y0, dx0, _), (y1, dx1, _) in zip(x, cpu, gpu):
        dy = dys.standard_normal(y0.shape).astype(dtype)  # the draws _layer_run made
        ref_y, ref_dx = reference(xb.astype(np.float64), layer, dy.astype(np.float64))
        np.testing.assert_array_equal(y1, y0)  # NaN in the same windows (equal_nan)
        np.testing.assert_array_equal(y1, ref_y.astype(dtype))
        np.testing.assert_array_equal(dx1, dx0)
        np.testing.assert_allclose(dx1, ref_dx, rtol=1e-5, atol=1e-6)
    assert np.isnan(cpu[0][0]).any()


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
@pytest.mark.parametrize("label_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_softmax_cross_entropy_gpu_path_matches_the_cpu_path(dtype, label_dtype, smoothing, monkeypatch):
    rng = np.random.default_rng(0)
    z, y = rng.standard_normal((6, 4)).astype(dtype) * 3, rng.integers(0, 4, 6).astype(label_dtype)

    def run():
        loss = registry.losses.build({"type": "SoftmaxCrossEntropy", "label_smoothing": smoothing})
        value = loss.forward(z, y)
        return value, loss.backward().copy(), loss.count_correct(z, y)

    cpu = run()
    with emulate(monkeypatch) as calls:
        gpu = run()
    assert calls["dlrun_sce_exp"] == calls["dlrun_sce_nll"] == calls["dlrun_sce_grad"] == 1
    assert np.asarray(gpu[0]).dtype == dtype
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-6)
    np.testing.assert_allclose(gpu[1], cpu[1], rtol=1e-6, atol=1e-8)
    assert int(gpu[2]) == int(cpu[2])


OPTIMIZERS = {
    "dlrun_sgd": "{type: SGD, learning_rate: 0.3, weight_decay: 0.01}",
    "dlrun_sgd_momentum": "{type: SGD, learning_rate: 0.3, momentum: 0.9, nesterov: true, weight_decay: 0.01}",
    "dlrun_adam": "{type: Adam, learning_rate: 0.01, weight_decay: 0.01}",
    "dlrun_adam-decoupled": "{type: AdamW, learning_rate: 0.01, weight_decay: 0.1}",
    "dlrun_rmsprop_momentum": "{type: RMSProp, learning_rate: 0.01, momentum: 0.5, weight_decay: 0.01}",
    "dlrun_rmsprop": "{type: RMSProp, learning_rate: 0.01}",
    "dlrun_adagrad": "{type: AdaGrad, learning_rate: 0.1, weight_decay: 0.01}",
}


def _fit(path, overrides, tmp_path, sub):
    config = load_config(path, overrides=overrides)
    result = train(config, runs_dir=tmp_path / sub)
    weights = {k: v.copy() for k, v in result.trainer.model.state_arrays().items()}
    return result.history.rows, weights, result.trainer.optimizer


def _same_run(cpu, gpu, rtol):
    (rows0, w0, _), (rows1, w1, _) = cpu, gpu
    assert len(rows0) == len(rows1)
    for r0, r1 in zip(rows0, rows1):
        np.testing.assert_allclose(r1["train_loss"], r0["train_loss"], rtol=rtol)
    assert w0.keys() == w1.keys()
    for k in w0:
        np.testing.assert_allclose(w1[k], w0[k], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("case", sorted(OPTIMIZERS))
def test_optimizer_gpu_update_matches_the_cpu_update(case, tmp_path, monkeypatch):
    """Spiral, minibatches of 64 over 300 points (a short last batch), 3 epochs."""
    overrides = [f"optimizer={OPTIMIZERS[case]}", "train.epochs=3", "train.batch_size=64"]
    cpu = _fit(CONFIGS / "spiral.yaml", overrides, tmp_path, "cpu")
    with emulate(monkeypatch) as calls:
        gpu = _fit(CONFIGS / "spiral.yaml", overrides, tmp_path, "gpu")
    assert calls[case.split("-")[0]] > 0, calls
    _same_run(cpu, gpu, rtol=2e-5)
    assert all("_work" not in slots for slots in gpu[2].state.values())  # the kernel needs no scratch
    assert any("_work" in slots for slots in cpu[2].state.values()) == cpu[2].needs_work


# BatchNorm before ReLU leaves half the pre-activations near the kink, and training amplifies a
# rounding difference: on the CPU alone, 1e-7 more in one weight of digits_resnet gives weights
# 1e-2 apart after two epochs. Such a config is compared over a few steps (one epoch on a fifth
# of the data: 6 steps), before the amplification, where the paths still agree to 1e-4.
SHORT = {"digits_resnet.yaml": ["train.epochs=1", "train.validation_split=0.8"]}


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_trains_the_same_on_the_gpu_path(config, tmp_path, monkeypatch):
    """Two epochs of each shipped config (a few steps of a chaotic one), CPU path against
    emulated GPU path."""
    overrides = SHORT.get(config, ["train.epochs=2"])
    cpu = _fit(CONFIGS / config, overrides, tmp_path, "cpu")
    with emulate(monkeypatch) as calls:
        gpu = _fit(CONFIGS / config, overrides, tmp_path, "gpu")
    assert sum(calls.values()) > 0
    _same_run(cpu, gpu, rtol=1e-4)


def test_the_emulator_enforces_cupy_calling_conventions():
    """A call CuPy would refuse fails here too: wrong dtype, wrong output shape, wrong count."""
    from collections import Counter

    sgd = next(k for k in KERNELS if k.name == "dlrun_sgd")
    run = Emulated(sgd, EMULATORS["dlrun_sgd"], Counter())
    w, g, h = np.ones(4, np.float32), np.ones(4, np.float32), np.array([0.5], np.float32)
    run(g, h, 0.0, w)
    np.testing.assert_array_equal(w, 0.5)
    with pytest.raises(TypeError, match="g is float64, but type T is float32"):
        run(g.astype(np.float64), h, 0.0, w)
    with pytest.raises(TypeError, match="h is raw: it takes an array"):
        run(g, 0.5, 0.0, w)
    with pytest.raises(TypeError, match="2 arguments, expected 3 or 4"):
        run(g, 0.5)
    relu = Emulated(next(k for k in KERNELS if k.name == "dlrun_relu"), EMULATORS["dlrun_relu"], Counter())
    with pytest.raises(ValueError, match="output y has shape"):
        relu(np.ones((2, 3), np.float32), np.empty((1, 3), np.float32))  # CuPy: 'Out shape is mismatched'
    with pytest.raises(TypeError, match="x is float32, but type T is float64"):
        relu(np.ones((2, 3), np.float32), np.empty((2, 3), np.float64))


def test_a_block_launch_computes_its_threads_from_the_compiled_limit():
    from types import SimpleNamespace

    from dlrun.backend import Launch

    def threads(work, limit):
        return Launch(SimpleNamespace(max_threads_per_block=limit)).threads(work)

    assert threads(128, 1024) == 128 and threads(1024, 1024) == 1024 and threads(1, 1024) == 32
    assert threads(37, 1024) == 64 and threads(4 * 257, 1024) == 1024  # whole warps, never past the limit
    assert threads(1024, 640) == 640 and threads(1024, 700) == 672 and threads(64, 20) == 20


def test_the_block_emulator_refuses_what_a_raw_pointer_would_misread():
    from collections import Counter

    from kernel_emulation import EmulatedBlock

    seq = next(k for k in BLOCK_KERNELS if k.name == "dlrun_lstm_sequence_grad")
    run = EmulatedBlock(seq, BLOCK_EMULATORS[seq.name], Counter(), np.float64)
    steps, n, h = 2, 3, 4
    args = [np.zeros((steps, n, h)), np.zeros((4 * h, h)), np.full((steps, n, 4 * h), 0.5), np.zeros((steps + 1, n, h)),
            np.zeros((steps, n, h)), np.empty((steps, n, 4 * h)), np.int32(steps), np.int32(n), np.int32(h)]
    run((n,), (32,), args)
    assert np.all(args[5] == 0)
    with pytest.raises(ValueError, match="not C-contiguous"):
        run((n,), (32,), [args[0].transpose(1, 0, 2).copy().transpose(1, 0, 2)] + args[1:])
    with pytest.raises(TypeError, match="float32"):
        run((n,), (32,), [args[0].astype(np.float32)] + args[1:])
    with pytest.raises(TypeError, match="int32"):
        run((n,), (32,), args[:6] + [steps] + args[7:])
    with pytest.raises(ValueError, match="threads"):
        run((n,), (2048,), args)
    with pytest.raises(TypeError, match="9"):
        run((n,), (32,), args[:-1])
