"""``--mode jacobian``: the full Jacobian of the output with respect to each checked tensor.

The Oxford practical's ``jacobiancheck`` and PyTorch's slow ``gradcheck``, for debugging: the
analytic Jacobian is built row by row, one backward per output element with a one-hot upstream
gradient; the numeric one column by column, one central difference of the whole output per
perturbed element. Every entry is compared with the elementwise rule, so a failure names the
output element and the tensor element whose derivative is wrong (the default modes compare
random projections Jᵀ·G: they catch the same bugs, but cannot say which output is involved).
It costs n_out backwards and 2·n forwards per tensor, so it is refused above ``MAX_ENTRIES``.
"""
from __future__ import annotations

import numpy as np

from ..backend import to_host
from .numeric import Probe, TensorRun, compare, element_derivative

MAX_ENTRIES = 250_000


class TooLarge(Exception):
    """The Jacobian has more entries than a debugging check should build."""


def _host64(a) -> np.ndarray:
    """A float64 host copy: never a view, since an output may alias the perturbed input."""
    return np.array(to_host(a), dtype=np.float64).ravel()


def check_jacobians(h, x, y, side, tensors, settings, where: str) -> list[TensorRun]:
    """``tensors``: (name, role, array) for the input "x" and the trainable parameters; backward
    runs on ``h`` at (x, y), the central differences on ``side`` (gradcheck.twin: the layer
    itself, or its float64 copy in a float32 check)."""
    layer = h.layer
    out = h.forward(x, y)
    n_out = out.size
    entries = n_out * sum(arr.size for _, _, arr in tensors)
    if entries > MAX_ENTRIES:
        raise TooLarge(f"--mode jacobian: {n_out} outputs x {sum(a.size for _, _, a in tensors)} checked elements "
                       f"= {entries:,} Jacobian entries, more than {MAX_ENTRIES:,}; use --mode auto, or smaller --dims")
    analytic = {name: np.empty((n_out, arr.size)) for name, _, arr in tensors}
    onehot = np.zeros(out.shape, dtype=out.dtype)
    for k in range(n_out):  # row k: the gradient of output element k
        onehot.flat[k] = 1
        if k:  # training calls backward once per forward: a layer may free or change its caches in it
            h.forward(x, y)
        dx = h.backward(onehot.copy())
        onehot.flat[k] = 0
        for name, _, _ in tensors:
            analytic[name][k] = _host64(dx if name == "x" else layer.params[name].grad)
    # the same central difference as the other modes, of the whole output instead of Σ G ⊙ out
    ref = side.harness
    whole = lambda: _host64(ref.forward(side.x, side.y))  # noqa: E731
    probe = Probe(whole, settings.step(side.dtype), ref.signature if ref.signed else None, side.sig0,
                  settings.kink_test(side.dtype), whole, vector=True)
    runs = []
    for name, role, arr in tensors:
        run = TensorRun(name, role, tuple(arr.shape), str(arr.dtype), "jacobian")
        numeric, keep, perturbed = np.empty((n_out, arr.size)), [], side.arrays[name]
        for e in range(arr.size):  # column e: the output's response to element e
            column, crossed = element_derivative(probe, perturbed, np.unravel_index(e, arr.shape), probe.h)
            if crossed:  # a kink between the two sides: the column is not a derivative
                run.skipped += n_out
                continue
            numeric[:, e] = column
            keep.append(e)
        cols = np.asarray(keep, dtype=np.int64)
        run.checked += n_out * cols.size
        _compare_columns(run, analytic[name][:, cols], numeric[:, cols], cols, out.shape, settings, where)
        runs.append(run)
    return runs


def _compare_columns(run, a, n, cols, out_shape, settings, where) -> None:
    """Compare entry by entry; the worst and the largest-gap entries are reported with their output
    element."""
    if cols.size == 0:
        return
    flat = np.repeat(cols[None, :], a.shape[0], axis=0).ravel()  # the tensor element of each entry
    compare(run, a.ravel(), n.ravel(), flat, settings.atol, settings.rtol, where)
    diff = np.abs(a - n)
    largest = np.where(np.isfinite(diff), diff, -np.inf)  # as compare() chose it: among finite entries
    for element, score in ((run.worst, diff - (settings.atol + settings.rtol * np.abs(n))), (run.largest, largest)):
        if element is None:
            continue
        k = int(np.argmax(score)) // a.shape[1]  # the row of the entry compare() reported
        out_idx = ",".join(str(int(i)) for i in np.unravel_index(k, out_shape))
        element.where = f"{where}; d out[{out_idx}] / d {run.name}"
