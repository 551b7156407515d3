"""A tiny float64 central-difference oracle for unit tests (independent of dlrun.gradcheck)."""
from __future__ import annotations

import numpy as np


def numeric_grad(f, a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f() / d a by central differences, perturbing ``a`` in place and restoring it exactly."""
    g = np.zeros_like(a, dtype=np.float64)
    flat, gflat = a.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        orig = flat[i]
        flat[i] = orig + eps
        fp = f()
        flat[i] = orig - eps
        fm = f()
        flat[i] = orig
        gflat[i] = (fp - fm) / (2 * eps)
    return g


def check_layer(layer, x: np.ndarray, y=None, seed: int = 0, atol=1e-6, rtol=1e-5):
    """Compare a built float64 layer's backward with central differences for x and every param."""
    rng = np.random.default_rng(seed)
    out = layer.forward(x, y) if layer.needs_labels else layer.forward(x)
    G = rng.standard_normal(out.shape)

    def loss():
        o = layer.forward(x, y) if layer.needs_labels else layer.forward(x)
        return float((o * G).sum())

    loss()
    dx = layer.backward(G.copy())
    grads = {n: p.grad.copy() for n, p in layer.params.items() if p.trainable}
    np.testing.assert_allclose(dx, numeric_grad(loss, x), atol=atol, rtol=rtol, err_msg="dx")
    for n, p in layer.params.items():
        if p.trainable:
            np.testing.assert_allclose(grads[n], numeric_grad(loss, p.data), atol=atol, rtol=rtol, err_msg=n)
