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


def _built(name, dims, rng):
    """(layer class, input spec, the layer set up in float64 and built, input shape, output shape)."""
    cls = registry.layers.get(name)
    layer = gi.build_layer(name, _options(name, dims), name)
    layer.setup(CPU, np.float64, rng, CPU.rng(0))
    shape = gi.per_sample_shape(cls.input_spec, dims)
    return cls, cls.input_spec, layer, shape, tuple(layer.build(shape))


@pytest.mark.parametrize("name", LAYERS)
def test_build_shapes_forward_backward_and_inputs_untouched(name):
    dims = gi.DIM_CONFIGS[0]
    rng = np.random.default_rng(0)
    cls, spec, layer, shape, out_shape = _built(name, dims, rng)
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



def _kinked(name) -> bool:
    from dlrun.layers.base import Layer

    cls = registry.layers.get(name)
    return cls.branch_signature is not Layer.branch_signature or cls.kink_distance is not Layer.kink_distance


@pytest.mark.parametrize("name", [n for n in LAYERS if _kinked(n)])
def test_a_declared_kink_distance_is_a_radius_no_step_crosses(name):
    """A layer with a branch_signature declares kink_distance, and joint steps of the input and
    the parameters shorter than half the distance leave the signature as it was."""
    from dlrun.gradcheck.kinks import freeze, same

    dims = gi.DIM_CONFIGS[1]
    rng = np.random.default_rng(1)
    cls, spec, layer, shape, out_shape = _built(name, dims, rng)
    params = [p.data for p in layer.params.values() if p.trainable]
    layer.training = True
    for _ in range(30):
        x = gi.draw_x(spec, (dims["N"], *shape), None, np.float64, rng)
        y = gi.labels(dims["N"], gi.label_count(spec, dims, out_shape), rng) if cls.needs_labels else None
        for p in params:
            p[...] = rng.standard_normal(p.shape)
        args = (x, y) if cls.needs_labels else (x,)
        d = layer.kink_distance(*args)
        assert d is not None, f"{name} has a branch_signature but no kink_distance"
        radius = 0.5 * float(np.min(d))
        assert radius > 0
        layer.forward(*args)
        sig = freeze(layer.branch_signature())
        saved = [p.copy() for p in params]
        for _ in range(10):
            steps = [rng.standard_normal(a.shape) for a in [x, *params]]
            scale = radius / np.sqrt(sum(float((s * s).sum()) for s in steps))
            for p, p0, s in zip(params, saved, steps[1:]):
                p[...] = p0 + scale * s
            layer.forward(x + scale * steps[0], *args[1:])
            assert same(freeze(layer.branch_signature()), sig), f"{name}: a step of norm {radius:.3g} crossed a kink"
        for p, p0 in zip(params, saved):
            p[...] = p0
