"""Test-only helpers for the catalogue layer tests: build a layer on its own and compare its
backward pass with float64 central differences of L = Σ forward(x) ⊙ dy.

Local to these tests until the shared gradient checker (dlrun gradcheck) lands.
"""
from __future__ import annotations

import numpy as np

from dlrun.backend import CPU


def make(layer, input_shape, dtype=np.float64, seed=0):
    """Set up and build ``layer`` for per-sample ``input_shape``; return its output shape."""
    layer.setup(CPU, dtype, np.random.default_rng(seed), np.random.default_rng(seed + 1))
    return tuple(layer.build(tuple(input_shape)))


def _frozen_forward(layer, x, rng_seed):
    """forward with the layer's state restored and its generator re-seeded afterwards, so
    every evaluation sees the same running statistics and the same random draws."""
    saved = {a: np.copy(getattr(layer, a)) for a in layer.state}
    if layer.stochastic:
        layer.rng = np.random.default_rng(rng_seed)
    out = layer.forward(x)
    for a, v in saved.items():
        getattr(layer, a)[...] = v
    return out


def check_gradients(layer, x, *, seed=0, eps=1e-6, rtol=1e-6, atol=1e-8, wrt_input=True):
    """Assert analytic dx and parameter gradients match central differences (float64).

    Elements whose perturbation changes ``branch_signature()`` (a kink was crossed) are skipped.
    Returns the number of input elements compared, so callers can check it is not zero.
    """
    rng = np.random.default_rng(seed)
    out = _frozen_forward(layer, x, 1234)
    dy = rng.standard_normal(out.shape)
    sig = layer.branch_signature()
    sig = None if sig is None else np.copy(sig)
    out = _frozen_forward(layer, x, 1234)
    dx = layer.backward(dy.copy())
    grads = {n: np.copy(p.grad) for n, p in layer.params.items() if p.trainable}

    def loss_and_sig(xv):
        o = _frozen_forward(layer, xv, 1234)
        s = layer.branch_signature()
        return float((o * dy).sum()), (None if s is None else np.copy(s))

    def same(s):
        return sig is None or (s.shape == sig.shape and np.array_equal(s, sig))

    compared = 0
    if wrt_input:
        num = np.zeros_like(x)
        ok = np.zeros(x.shape, dtype=bool)
        for i in np.ndindex(x.shape):
            xp_, xm = x.copy(), x.copy()
            xp_[i] += eps
            xm[i] -= eps
            lp, sp = loss_and_sig(xp_)
            lm, sm = loss_and_sig(xm)
            if same(sp) and same(sm):
                num[i] = (lp - lm) / (2 * eps)
                ok[i] = True
        compared = int(ok.sum())
        np.testing.assert_allclose(dx[ok], num[ok], rtol=rtol, atol=atol, err_msg="dL/dx")
    for name, g in grads.items():
        p = layer.params[name].data
        num = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            lp, _ = loss_and_sig(x)
            p[i] = old - eps
            lm, _ = loss_and_sig(x)
            p[i] = old
            num[i] = (lp - lm) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=rtol, atol=atol, err_msg=f"dL/d{name}")
    return compared
