"""Aux checks of the ways training calls a layer that the numeric check does not: fast mode,
strided arrays, parameters that the output does not depend on, and an undeclared phase.

The numeric check calls a layer in plain mode on fresh contiguous arrays. Training calls it in
fast mode (``layer.buffers.enabled``: outputs and gradients may be written into reused buffers),
and hands it views: a slice of a batch, the transposed gradient that a Conv2D returns. A layer
that is right on the first and wrong on the others passes a check that never calls it that way
(PyTorch's gradcheck has the same blind spot; Chainer checks non-contiguous inputs by default).
"""
from __future__ import annotations

import numpy as np

from .harness import Harness, LayerRaised

# results that differ only by rounding (another summation order) pass: the largest difference
# relative to the largest magnitude of the tensor must stay below this, per dtype
_RTOL = {"float64": 1e-9, "float32": 1e-4}


def _call(h, x, y, g) -> tuple:
    """Host copies of (output, dx, trainable gradients) of one forward and backward."""
    host = h.device.host
    out = host(h.forward(x, y))
    dx = h.backward(g)
    grads = {n: host(p.grad) for n, p in h.layer.params.items() if p.trainable}
    return out, None if dx is None or getattr(dx, "dtype", None) is None else host(dx), grads


def _gap(a: tuple, b: tuple, rtol: float, skip=frozenset()) -> str | None:
    """The first of output, dx and gradients (but those named in ``skip``) that differs between
    two calls beyond rounding."""
    pairs = [("the output", a[0], b[0])] + ([("dx", a[1], b[1])] if "x" not in skip else [])
    pairs += [(f"{n}.grad", a[2][n], b[2].get(n)) for n in a[2] if n not in skip]
    for what, u, v in pairs:
        if u is None or v is None or u.dtype.kind not in "fc":
            continue
        if u.shape != v.shape:
            return f"{what} has shape {v.shape}, not {u.shape}"
        scale = max(float(np.max(np.abs(u), initial=0.0)), 1e-30)
        diff = float(np.max(np.abs(u.astype(np.float64) - v), initial=0.0))
        if not diff <= rtol * scale:  # NaN counts as a difference
            return f"{what} differs by up to {diff:.3g} (largest entry {scale:.3g})"
    return None


def _rows(a, rows):
    return None if a is None else a[rows]


def fast_mode_problem(h, x, y, g: np.ndarray, dtype: str, skip=frozenset()) -> str | None:
    """What differs when the layer runs with its buffers enabled, as in training, over three
    calls: the point, its rows reversed, and one row fewer (the last, smaller batch of an epoch).
    Each must equal the same call in plain mode: a buffer that keeps the last call's values or
    accumulates shows as a difference. ``skip``: tensors ("x", parameter names) not compared."""
    n = x.shape[0]
    cases = [(slice(None), "the point"), (slice(None, None, -1), "its rows reversed")]
    if n > 1:
        cases.append((slice(0, n - 1), f"{n - 1} of its {n} rows"))
    calls = [(_rows(x, r), _rows(y, r), g[r], what) for r, what in cases]  # (_call gets a copy of g)
    plain = []
    for xs, ys, gs, what in calls:
        try:
            plain.append(_call(h, xs, ys, gs.copy()))
        except LayerRaised as e:
            if _refuses(h, xs, ys, gs):  # a layer that takes only some batch sizes (even, N >= 2)
                calls = calls[:len(plain)]
                break
            return (f"at {what} after a call at {calls[0][3]}, {e.what}, although a new instance takes that "
                    f"batch: a cache or buffer sized by an earlier batch (the last batch of an epoch is smaller)")
    fast = []
    h.layer.buffers.enabled = True
    try:
        for xs, ys, gs, what in calls:
            fast.append(_call(h, xs, ys, gs.copy()))
    except LayerRaised as e:  # plain mode took this call: e.g. a buffer of the first batch's size
        return (f"with its buffers enabled (training's fast mode), at {what} (after a call at {calls[0][3]}), "
                f"{e.what}, which plain mode did not")
    finally:
        h.layer.buffers.enabled = False
    for (_, _, _, what), a, b in zip(calls, plain, fast):
        gap = _gap(a, b, _RTOL[dtype], skip)
        if gap:
            return (f"with its buffers enabled (training's fast mode), at {what} after {len(calls)} calls, {gap} "
                    f"from the plain call: a reused buffer keeps or accumulates values, or one buffer name "
                    f"serves two arrays alive at once (arrays of one name share memory)")
    return None


def _refuses(h, x, y, g) -> bool:
    """Whether a new instance of the layer, called first with this batch, raises too (it takes
    only some batch sizes); True when the check cannot make one."""
    if h.fresh is None:
        return True
    try:
        _call(Harness(h.fresh(), h.seed, h.device), x, y, g.copy())
    except LayerRaised:
        return True
    return False


def _strided(xp, a):
    """``a`` as a view with every second element of a twice-as-long last axis: same values, not
    contiguous (as a slice of a larger array is)."""
    big = xp.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _fortran(xp, a):
    """``a`` in Fortran (column-major) order: same values, the layout of a transposed array."""
    return xp.asfortranarray(a)


def layout_problem(h, x, y, g: np.ndarray, dtype: str, skip=frozenset()) -> str | None:
    """What differs when forward gets x and backward its upstream gradient as non-contiguous
    views, then in Fortran order (same values): ``ravel()`` or ``reshape`` of such an array is a
    copy, so a layer that writes through one loses the writes. ``skip``: as fast_mode_problem."""
    xp = h.device.backend.xp
    if x.ndim < 2 or x.shape[-1] == 0:
        return None
    a = _call(h, x, y, g.copy())
    for how, make in (("strided views", _strided), ("Fortran-ordered arrays", _fortran)):
        try:
            b = _call(h, make(xp, x), y, make(xp, h.device.put(g.copy())))
        except LayerRaised as e:
            return f"with the input and the upstream gradient as {how} (same values), {e.what}"
        gap = _gap(a, b, _RTOL[dtype], skip)
        if gap:
            return (f"with the input and the upstream gradient as {how} (same values), {gap} from C-contiguous "
                    f"ones: the layer writes through a copy (ravel, reshape, .flat) or assumes C order")
    return None


def unwired(h, trainable: dict, grads: dict, x, y, out0: np.ndarray, rng) -> list[str]:
    """Parameters whose perturbation leaves the output unchanged (not used, or the layer reads a
    copy). In evaluation a parameter with a zero gradient is not one of them: a layer may use it in
    training only (a learned noise scale)."""
    dev, names = h.device, []
    for n, p in trainable.items():
        if p.data.size == 0:  # nothing to perturb (units: 0)
            continue
        if not h.layer.training and not np.any(grads[n]):
            continue
        saved = p.data.copy()
        dev.assign(p.data, dev.host(saved) + 1e-2 * rng.standard_normal(saved.shape))
        moved = dev.host(h.forward(x, y))
        p.data[...] = saved
        if np.array_equal(moved, out0):
            names.append(n)
    return names


def reads_phase(h, point) -> bool:
    """Whether the layer's output at ``point`` differs between training and evaluation (it reads
    ``self.training``), for a layer that does not declare ``has_phase``."""
    layer, dev = h.layer, h.device
    x, y = dev.put(point.x), dev.put(point.y)
    try:
        layer.training = True
        train = dev.host(h.forward(x, y))
        layer.training = False
        return not np.array_equal(train, dev.host(h.forward(x, y)), equal_nan=True)
    finally:
        layer.training = True
