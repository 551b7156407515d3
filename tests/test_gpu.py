"""CPU (numpy) and GPU (CuPy) agree: every registered layer forward and backward, the fast
training path, and a shipped config trained end to end.

Marked ``gpu``; skipped where CuPy or a CUDA device is missing.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import get_backend, gpu_available, to_host
from dlrun.model import Sequential
from conftest import CONFIGS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")]

DIMS = {"D": 5, "C": 4, "H": 6, "W": 7, "T": 3}
N = 3


def _dim(v):
    return DIMS.get(v, v) if isinstance(v, str) else v


def _inputs(spec, rng):
    shape = (N,) + tuple(_dim(d) for d in spec.shape)
    if spec.kind == "index":
        return rng.integers(0, int(_dim(spec.high) or 2), shape)
    if spec.kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if spec.kind == "prob":
        e = np.exp(rng.standard_normal(shape))
        return e / e.sum(axis=-1, keepdims=True)
    return rng.standard_normal(shape)


def _build(name, backend):
    cls = registry.layers.get(name)
    spec = cls.input_spec
    opts = {k: _dim(v) for k, v in spec.options.items()}
    layer = registry.layers.build({"type": name, **opts})
    x_shape = tuple(_dim(d) for d in spec.shape)
    return Sequential([layer], x_shape, backend, np.float64, seed=7), spec


@pytest.mark.parametrize("name", registry.layers.names())
@pytest.mark.parametrize("training", [True, False])
def test_layer_forward_backward_match_cpu(name, training):
    cpu, spec = _build(name, get_backend("cpu"))
    gpu, _ = _build(name, get_backend("gpu"))
    if training and cpu.layers[0].stochastic:
        pytest.skip("random draws differ between numpy and CuPy generators; compared in eval mode")
    for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        np.testing.assert_array_equal(pc.data, to_host(pg.data), err_msg=f"initial {n}")
    rng = np.random.default_rng(0)
    x = _inputs(spec, rng)
    y = None
    if cpu.layers[0].needs_labels:
        high = int(_dim(spec.labels) if spec.labels is not None else cpu.output_shape[-1])
        y = rng.integers(0, high, N)
    outs = []
    for model in (cpu, gpu):
        model.train(training)
        xp = model.backend.xp
        xd = model.backend.asarray(x if spec.kind == "index" else x.astype(np.float64))
        yd = None if y is None else model.backend.asarray(y)
        out = model.forward(xd, yd)
        dy = np.random.default_rng(1).standard_normal(out.shape)
        dx = model.backward(model.backend.asarray(dy))
        grads = {n: to_host(p.grad) for n, p in model.named_parameters() if p.trainable}
        outs.append((to_host(out), None if dx is None or spec.kind == "index" else to_host(dx), grads))
        assert xp is (np if model.backend.name == "cpu" else __import__("cupy"))
    (oc, dc, gc), (og, dg, gg) = outs
    np.testing.assert_allclose(og, oc, rtol=1e-7, atol=1e-9, err_msg="forward")
    if dc is not None:
        np.testing.assert_allclose(dg, dc, rtol=1e-7, atol=1e-9, err_msg="input gradient")
    for n in gc:
        np.testing.assert_allclose(gg[n], gc[n], rtol=1e-7, atol=1e-9, err_msg=f"gradient of {n}")


def test_fast_training_path_matches_cpu():
    from dlrun.optimizers import SGD
    from dlrun.trainer import Trainer

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((50, 4)).astype(np.float32), rng.integers(0, 3, 50)
    hist = []
    for device in ("cpu", "gpu"):
        layers = [registry.layers.build(s) for s in ({"type": "Linear", "units": 16}, "ReLU",
                                                      {"type": "Linear", "units": 3})]
        model = Sequential(layers, (4,), get_backend(device), seed=0)
        opt = SGD(learning_rate=0.1, momentum=0.9)
        opt.block_size = 8  # exercise the blocked update on CuPy views too
        trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), opt, batch_size=16, shuffle=False)
        hist.append([r["train_loss"] for r in trainer.fit(x, y, epochs=5).rows])
    np.testing.assert_allclose(hist[1], hist[0], rtol=1e-4)


@pytest.mark.slow
def test_spiral_config_trains_on_gpu_like_on_cpu(cli, tmp_path):
    losses = {}
    for device in ("cpu", "gpu"):
        r = cli("train", CONFIGS / "spiral.yaml", "--device", device, "--set", "train.epochs=20",
                "--runs-dir", tmp_path / device)
        assert r.code == 0, r.err
        run_dir = next((tmp_path / device).iterdir())
        losses[device] = json.loads((run_dir / "summary.json").read_text())["train_loss"]
    assert losses["gpu"] == pytest.approx(losses["cpu"], rel=1e-3)
