"""A GPU run never sends CuPy arrays through numpy's ufunc dispatch, checked without a GPU.

CuPy runs an operator's kernel directly when both operands are CuPy arrays, when a Python number
is on the left (``2 * x``), and in place (``x *= 2``). ``x * 2``, ``x > 0``, a numpy scalar on
either side, or a numpy ufunc called on a CuPy array goes through ``numpy.multiply`` and the like
to ``cupy.ndarray.__array_ufunc__`` instead, whose first call imports ``cupyx.scipy.special`` and
with it SciPy: a fifth of a second added to every GPU run's start (measured on an H200), and a
slower call each time after. tests/device_emulation.py's stand-in for CuPy follows CuPy's rules
and notes where dlrun's own code took the slow road.
"""
from __future__ import annotations

import numpy as np
import pytest

import dlrun.backend.backend as backend_module
from contract_rows import ROWS
from dlrun import registry
from dlrun.gradcheck import inputs as gi
from conftest import CONFIGS, run_cli
from device_emulation import FAKE_CUPY, clear_numpy_dispatches, emulated_gpu, numpy_dispatches
from kernel_emulation import emulate


def _dispatched(f, gpu) -> list[str]:
    clear_numpy_dispatches()
    f(gpu)
    return numpy_dispatches()


@pytest.mark.parametrize("expr,slow", [
    ("a * 2", True), ("a > 0", True), ("a - 0.5", True), ("a ** 3", True), ("a * np.float32(2)", True),
    ("np.float32(2) * a", True), ("np.exp(a)", True),
    ("2 * a", False), ("0.5 - a", False), ("a * a", False), ("a ** 2", False), ("-a", False), ("a.sum()", False),
    ("xp.multiply(a, 2)", False), ("xp.greater(a, 0)", False), ("xp.exp(a)", False), ("xp.add.reduce(a)", False),
    ("a.__imul__(2)", False),
])
def test_the_stand_in_dispatches_where_cupy_does(expr, slow, monkeypatch):
    # (only calls made from dlrun's own modules are noted, so the expression runs as if it were one)
    code = compile(expr, registry.__file__, "eval")
    with emulated_gpu(monkeypatch) as gpu:
        a = gpu.asarray(np.arange(1.0, 4.0, dtype=np.float32))
        seen = _dispatched(lambda g: eval(code, {"np": np, "xp": FAKE_CUPY, "a": a}), gpu)
    assert bool(seen) == slow, seen


def _layer_both_ways(name, gpu):
    cls = registry.layers.get(name)
    dims = gi.DIM_CONFIGS[0]
    layer = gi.build_layer(name, gi.layer_options(cls.input_spec, dims, ROWS.get(name, {})), name)
    layer.setup(gpu, np.float32, np.random.default_rng(0), gpu.rng(0))
    shape = gi.per_sample_shape(cls.input_spec, dims)
    out_shape = tuple(layer.build(shape))
    rng = np.random.default_rng(1)
    spec = cls.input_spec
    high = gi.index_high(spec, dims, layer) if spec.kind == "index" else None
    x = gpu.asarray(gi.draw_x(spec, (dims["N"], *shape), high, np.float32, rng))
    y = gpu.asarray(gi.labels(dims["N"], gi.label_count(spec, dims, out_shape), rng)) if cls.needs_labels else None
    for training in (True, False):
        layer.training = training
        out = layer.forward(x, y) if cls.needs_labels else layer.forward(x)
        layer.backward(gpu.asarray(rng.standard_normal(out.shape).astype(np.float32)))


@pytest.mark.parametrize("name", registry.layers.names())
def test_every_registered_layer_computes_with_cupys_own_kernels(name, monkeypatch):
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        seen = _dispatched(lambda g: _layer_both_ways(name, g), gpu)
    assert not seen, f"device arrays went through numpy's ufunc dispatch at {seen}"


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_a_whole_gpu_run_of_every_shipped_config_computes_with_cupys_own_kernels(config, monkeypatch, tmp_path):
    """Training with validation, metrics and checkpoints, then evaluate and predict on the run."""
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        monkeypatch.setattr(backend_module, "_gpu", gpu)
        clear_numpy_dispatches()
        r = run_cli("train", CONFIGS / config, "--device", "gpu", "--set", "train.epochs=2",
                    "--runs-dir", tmp_path, process=False)
        assert r.code == 0, r.err
        run_dir = next(tmp_path.iterdir())
        r = run_cli("evaluate", run_dir, "--device", "gpu", process=False)
        assert r.code == 0, r.err
    seen = numpy_dispatches()
    assert not seen, f"device arrays went through numpy's ufunc dispatch at {sorted(set(seen))}"
