"""The layer contract, for every registered layer: build, shapes, forward/backward, float64
gradcheck (via dlrun.gradcheck), inputs untouched; plus a guard that every layer has a row."""
from __future__ import annotations

import numpy as np
import pytest

from contract_rows import ROWS
from dlrun import registry
from dlrun.backend import CPU
from dlrun.gradcheck import PASS, check_layer
from dlrun.gradcheck import inputs as gi

LAYERS = registry.layers.names()


def test_every_registered_layer_has_a_contract_row():
    missing = [n for n in LAYERS if n not in ROWS]
    assert not missing, f"add rows to tests/contract_rows.py for: {', '.join(missing)}"


def _options(name, dims):
    return gi.layer_options(registry.layers.get(name).input_spec, dims, ROWS.get(name, {}))


@pytest.mark.parametrize("name", LAYERS)
def test_build_shapes_forward_backward_and_inputs_untouched(name):
    cls = registry.layers.get(name)
    spec = cls.input_spec
    dims = gi.DIM_CONFIGS[0]
    layer = gi.build_layer(name, _options(name, dims), name)
    rng = np.random.default_rng(0)
    layer.setup(CPU, np.float64, rng, CPU.rng(0))
    shape = gi.per_sample_shape(spec, dims)
    out_shape = tuple(layer.build(shape))
    high = gi.index_high(spec, dims, layer) if spec.kind == "index" else None
    x = gi.draw_x(spec, (dims["N"], *shape), high, np.float64, rng)
    y = gi.labels(dims["N"], gi.label_count(spec, dims, out_shape), rng) if cls.needs_labels else None
    x0, y0 = x.copy(), None if y is None else y.copy()
    for training in (True, False):
        layer.training = training
        out = layer.forward(x, y) if cls.needs_labels else layer.forward(x)
        assert out.shape == (dims["N"], *out_shape)
        assert out.dtype == np.float64 and np.isfinite(out).all()
        dy = rng.standard_normal(out.shape)
        dy0 = dy.copy()
        dx = layer.backward(dy)
        if spec.kind in gi.FLOAT_KINDS:
            assert dx.shape == x.shape and dx.dtype == x.dtype
        for p in layer.params.values():
            if p.trainable:
                assert p.grad.shape == p.data.shape and np.isfinite(p.grad).all()
        assert np.array_equal(dy, dy0)
    assert np.array_equal(x, x0)
    assert y is None or np.array_equal(y, y0)


@pytest.mark.parametrize("name", LAYERS)
def test_float64_gradcheck_passes(name):
    report = check_layer(name, ROWS.get(name, {}))
    bad = [(t.name, t.worst, t.notes) for t in report.tensors if t.status != PASS]
    bad += [(a.name, a.detail) for a in report.aux if a.status not in (PASS, "n/a")]
    assert report.verdict == PASS, (report.error, bad)


@pytest.mark.parametrize("name", LAYERS)
def test_fast_mode_buffers_give_the_plain_results(name):
    """In fast mode a layer may write outputs and gradients into reused per-shape buffers: three
    calls with new inputs (the last a smaller batch) must equal a twin layer in plain mode, so
    no call sees stale buffer contents."""
    cls = registry.layers.get(name)
    spec = cls.input_spec
    dims = gi.DIM_CONFIGS[0]
    twins = []
    for pooled in (False, True):
        layer = gi.build_layer(name, _options(name, dims), name)
        layer.setup(CPU, np.float64, np.random.default_rng(0), CPU.rng(0))
        out_shape = tuple(layer.build(gi.per_sample_shape(spec, dims)))
        layer.buffers.enabled = pooled
        twins.append(layer)
    rng = np.random.default_rng(1)
    shape = gi.per_sample_shape(spec, dims)
    for n in (dims["N"], dims["N"], dims["N"] - 2):
        high = gi.index_high(spec, dims, twins[0]) if spec.kind == "index" else None
        x = gi.draw_x(spec, (n, *shape), high, np.float64, rng)
        y = gi.labels(n, gi.label_count(spec, dims, out_shape), rng) if cls.needs_labels else None
        dy = rng.standard_normal((n, *out_shape))
        results = []
        for layer in twins:
            out = (layer.forward(x, y) if cls.needs_labels else layer.forward(x)).copy()
            dx = layer.backward(dy.copy())
            grads = {k: p.grad.copy() for k, p in layer.params.items() if p.trainable}
            results.append((out, None if dx is None else dx.copy(), grads))
        (out0, dx0, g0), (out1, dx1, g1) = results
        np.testing.assert_allclose(out1, out0, rtol=1e-12, atol=1e-12)
        if dx0 is not None and spec.kind in gi.FLOAT_KINDS:
            np.testing.assert_allclose(dx1, dx0, rtol=1e-12, atol=1e-12)
        for k in g0:
            np.testing.assert_allclose(g1[k], g0[k], rtol=1e-12, atol=1e-12, err_msg=k)
