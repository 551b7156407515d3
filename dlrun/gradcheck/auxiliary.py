"""Auxiliary checks, each reported as its own PASS/FAIL line.

* output-shape: forward returns (N, *shape that build declared) in the dtype of the check;
* output-finite: forward's output at the (finite) check point holds no NaN or inf;
* output-aliasing: a second forward, at other inputs, leaves the first one's output as it was
  (no output buffer reused across calls: a caller may keep outputs);
* grad-structure: every float input and trainable parameter gets a gradient of its own shape
  and dtype (a mismatch is a FAIL with a message, never a crash), and backward writes every
  element of each parameter gradient (they are filled with the dtype's largest value first, as
  in training's first step), and (float64 checks) does not compute a gradient in float32;
* zero-upstream: backward(0) gives exact zeros (backward multiplies by the upstream gradient);
* reentrant: backward twice after one forward gives identical results (no accumulation);
* inputs-unchanged: forward and backward leave x, y and the upstream gradient as they were;
* state: undeclared public counters/coefficients do not change in a step (declare them in
  ``state`` so they are frozen, checkpointed and restored);
* second-point: a tensor that passes at point 1 also passes at point 2 on the same instance
  (stale caches, accumulating buffers);
* wiring: perturbing each trainable parameter changes the output;
* fast-mode: with the layer's buffers enabled (training's fast mode) three calls give what they
  give in plain mode (gradcheck.paths);
* non-contiguous: a strided or Fortran-ordered input and upstream gradient give what C-contiguous
  ones give;
* float32 (float64 checks): a float32 forward/backward returns float32 output, dx and gradients;
* adds-gradient (regularizers): ``add_gradient`` adds its increment to the gradient it is given;
* kink-skips (shown only when it fails): after every redraw a point still has over half of its
  differences skipped for crossing a kink.

reentrant and state are root causes: a layer that does not give the same result twice at one
point (a buffer that accumulates, a coefficient annealed in backward, a mask kept from an earlier
call) also fails every check that compares two of its calls, and its tensors fail against
differences taken after later calls. :func:`attribute` reports those as following from the root
cause instead of blaming them on causes of their own.
"""
from __future__ import annotations

import math
import numbers
import re

import numpy as np

from ..model.contract import UNWRITTEN_HINT, mark_unwritten, transposed_shape, unwritten
from .diagnose import Pattern
from .harness import LayerRaised
from .report import FAIL, NA, PASS, AuxResult

NAMES = ("output-shape", "output-finite", "output-aliasing", "grad-structure", "zero-upstream", "reentrant",
         "inputs-unchanged", "state", "second-point", "wiring", "fast-mode", "non-contiguous", "float32", "adds-gradient", "kink-skips")


class AuxLog:
    """Collects aux outcomes over every point; the first failure's detail is kept."""

    def __init__(self):
        self.results = {n: AuxResult(n) for n in NAMES}

    def record(self, name: str, ok: bool, detail: str = "", where: str = "", note: str = "") -> None:
        """``detail`` explains a failure; ``note`` is informative text kept on a PASS."""
        r = self.results[name]
        if not ok:
            if r.status != FAIL:
                r.status, r.detail = FAIL, f"{detail} ({where})" if where else detail
        elif r.status == NA:
            r.status, r.detail = PASS, note
        elif r.status == PASS and note and not r.detail:
            r.detail = note

    def merge(self, other: "AuxLog") -> None:
        for n, r in other.results.items():
            if r.status != NA:
                ok = r.status == PASS
                self.record(n, ok, "" if ok else r.detail, note=r.detail if ok else "")

    def listing(self) -> list[AuxResult]:
        return list(self.results.values())


def grad_problem(grad, ref, what: str) -> str | None:
    """Why ``grad`` cannot be the gradient of ``ref`` (None when it can)."""
    if grad is None:
        return f"{what}: backward gave no gradient (None{': a missing return?' if what in ('x', 'z') else ''})"
    shape = getattr(grad, "shape", None)
    if shape is None:
        return f"{what}: gradient is a {type(grad).__name__}, not an array"
    if tuple(shape) != tuple(ref.shape):
        return (f"{what}: grad shape {tuple(shape)} != {'input' if what in ('x', 'z') else 'param'} shape "
                f"{tuple(ref.shape)}{transposed_shape(shape, ref.shape)}")
    if grad.dtype != ref.dtype:
        return f"{what}: grad dtype {grad.dtype} != tensor dtype {ref.dtype}" + by_design(grad.dtype, ref.dtype)
    return None


def by_design(got, want) -> str:
    """'; a layer that computes in float32 by design ...' when float32 came back from a float64
    check, else ''."""
    if np.dtype(got) != np.float32 or np.dtype(want) != np.float64:
        return ""
    return "; " + FLOAT32_BY_DESIGN


FLOAT32_BY_DESIGN = "if the layer computes in float32 by design, check it with --dtype float32"


def unwritten_by(h, trainable: dict, x, y, g: np.ndarray, grads: dict) -> dict:
    """Which trainable gradients a backward on the point's first row leaves partly unwritten,
    name -> why.

    Each float gradient is first filled with its dtype's largest value, as training's first step
    does: an element backward does not set (or adds to with ``+=``) keeps it. One row leaves most
    labels and indices out of the batch, so a backward that zeroes only the rows it scatters into
    shows too. Afterwards the layer runs forward at the whole point again and the gradients are
    put back to ``grads`` (host copies): the checks after this one see what they would have seen
    without it. A layer that cannot take one row is checked on the whole point."""
    for rows in (slice(0, 1), slice(None)):
        mark_unwritten(p.grad for p in trainable.values())
        try:
            h.forward(x[rows], None if y is None else y[rows])
            h.backward(g[rows].copy())
            break
        except LayerRaised:
            if rows.stop is None:
                raise
    out = {}
    for n, p in trainable.items():
        ref = grads[n]
        if getattr(p.grad, "dtype", None) is None or ref is None or tuple(p.grad.shape) != ref.shape:
            continue  # grad-structure names a missing or misshapen gradient
        left = unwritten(p.grad)
        if left:
            out[n] = (f"{n}: backward did not write every element of {n}.grad ({left} of {p.grad.size} kept the "
                      f"value they had before it); {UNWRITTEN_HINT}")
        h.device.assign(p.grad, ref)
    h.forward(x, y)  # the caches of the point again, for the backward calls that follow
    return out


def skip_problem(runs: list, redraws: int) -> str | None:
    """Why a point whose differences cross kinks after every redraw cannot be trusted, or None:
    over half of all its differences skipped. (Fewer are a point near kinks; a parameter that moves
    every kink at once, a learned threshold, can have all of its own skipped: it is reported 'not
    compared', and what was compared still counts.)"""
    skipped, checked = sum(r.skipped for r in runs), sum(r.checked for r in runs)
    if skipped <= 0.5 * (skipped + checked):
        return None
    return (f"{skipped} of {skipped + checked} differences crossed a kink (the branch signature changed under the "
            f"step) after {redraws} redraw(s) of the point, so too little was compared: a signature must change only "
            f"where the branch switches (a mask such as x > 0, an argmax), not with every value; or --eps is too large "
            f"for how close together its kinks are")


def float32_values(grad, what: str) -> str | None:
    """Why a float64 gradient was computed in float32: every nonzero element (at least 4) is a
    float32 number, which a float64 computation from random inputs gives with odds of about 2⁻²⁹
    per element. A scratch array made with np.float32 does it, and costs the check its precision
    (errors near 1e-7 pass the float64 tolerances)."""
    if grad is None or getattr(grad, "dtype", None) != np.float64:
        return None
    if not float32_valued(grad):
        return None
    return (f"{what}: every element of its gradient is a float32 value although the check runs in float64: backward "
            f"computes it in float32 (a scratch array made with np.float32?); make scratch arrays in the input's "
            f"dtype (np.zeros_like(x), or dtype=x.dtype), or, {FLOAT32_BY_DESIGN}")


def float32_valued(a) -> bool:
    """Whether every finite nonzero element of a float64 array (at least 4) is a float32 number,
    not all of them integers: what a computation in float32 gives, and a float64 one from random
    inputs with odds of about 2⁻²⁹ per element."""
    if a is None or getattr(a, "dtype", None) != np.float64:
        return False
    nz = a[a != 0]
    nz = nz[np.isfinite(nz)]
    return bool(nz.size >= 4 and np.array_equal(nz.astype(np.float32).astype(np.float64), nz)
                and not np.array_equal(nz, np.round(nz)))


def float32_note(out, dtype: str) -> str | None:
    """A float64 check's note for failing tensors when forward computes in float32 (its output
    is float32, or holds float32 values only): float64's step differences float32 rounding."""
    if dtype != "float64" or out is None:
        return None
    if getattr(out, "dtype", None) != np.float32 and not float32_valued(out):
        return None
    return ("forward computes in float32 (its output holds float32 values only), so differences with float64's step "
            f"1e-6 measure float32 rounding, not the derivative; {FLOAT32_BY_DESIGN} (float32's step and tolerances)")


ROOTS = ("reentrant", "state")  # the layer is not the same function from call to call
# checks that compare two calls (second-point is not one: it names a stale cache itself)
DERIVED = ("zero-upstream", "fast-mode", "non-contiguous", "kink-skips")


def attribute(aux: list, tensors: list) -> None:
    """When a root cause failed (reentrant, state), the checks that compare two calls of the layer
    (DERIVED) fail whatever else is right or wrong, each naming a cause of its own (a reused buffer,
    a copy through ravel, a signature that changes with every value), and the failing tensors were
    compared with differences taken after later calls (a pattern such as '2 ×' is the number of
    calls, not a factor in the formula). Those checks become n/a with a line naming the root
    cause, and the tensors' pattern notes give way to one saying the same."""
    roots = [a.name for a in aux if a.name in ROOTS and a.status == FAIL]
    if not roots:
        return
    cause = " and ".join(f"aux {r}" for r in roots)
    for a in aux:
        if a.name in DERIVED and a.status == FAIL:
            a.status = NA
            a.detail = (f"not judged: follows from {cause} (the layer does not give the same result twice at one "
                        f"point, so two calls differ whatever this check looks for)")
    for t in tensors:
        if t.status != FAIL:
            continue
        kept = [n for n in t.notes if not isinstance(n, Pattern)]
        t.notes = kept + [f"{t.name}: not diagnosed further: the layer does not give the same result twice at one "
                          f"point ({cause}), so its gradient and the finite differences come from calls that differ; "
                          f"this failure may follow from that alone: fix it first"]


_BROADCAST = re.compile(r"could not broadcast input array from shape \(([\d, ]*)\) into shape \(([\d, ]*)\)")


def misfit_gradient(e: LayerRaised, tensors: dict) -> tuple[list[str], str] | None:
    """``backward`` raised numpy's broadcast error while writing into an array of a gradient's
    shape (``p.grad[...] = x.T @ dy``): the names of the tensors of that shape (``tensors``: name ->
    shape) and a line saying what was written, or None for any other error."""
    m = _BROADCAST.search(str(e.error)) if e.call == "backward" and isinstance(e.error, ValueError) else None
    if m is None:
        return None
    got, into = (tuple(int(v) for v in g.replace(" ", "").split(",") if v) for g in m.groups())
    names = [n for n, shape in tensors.items() if tuple(shape) == into]
    if not names:
        return None
    what = " or ".join(f"{n}.grad" if n != "x" else "dx" for n in names)
    return names, (f"{', '.join(names)}: backward writes an array of shape {got} into {what}, of shape {into}"
                   f"{transposed_shape(got, into) or ': the gradient has the wrong shape'}")


def max_gap(a: dict, b: dict) -> tuple[str, float] | None:
    """The tensor where two gradient sets differ most (exactly), or None when identical."""
    worst = None
    for k in a:
        if k not in b or a[k] is None or b[k] is None:
            continue
        if a[k].shape != b[k].shape or not np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind in "fc"):
            gap = float(np.nanmax(np.abs(a[k] - b[k]))) if a[k].shape == b[k].shape else float("inf")
            gap = float("inf") if np.isnan(gap) else gap  # NaN in one call only
            if worst is None or gap > worst[1]:
                worst = (k, gap)
    return worst


def magnitude(g) -> float:
    """The scale nondet_tol is relative to: the largest gradient entry, at least 1."""
    return max(1.0, float(np.max(np.abs(g)))) if g is not None and g.size else 1.0


def repeatable(first: np.ndarray, again: np.ndarray, nondet_tol: float) -> bool:
    """Whether two forwards at the same point agree: identically, or within ``nondet_tol``
    relative to the output's magnitude (as the reentrant check allows backward on a GPU)."""
    if np.array_equal(first, again, equal_nan=True):
        return True
    return nondet_tol > 0 and first.shape == again.shape and bool(
        np.allclose(first, again, rtol=0, atol=nondet_tol * magnitude(first), equal_nan=True))


def nonzero(grads: dict) -> list[str]:
    return [k for k, g in grads.items() if g is not None and np.any(g != 0)]


def changed(before: dict, after: dict) -> list[str]:
    """Names whose arrays differ (exactly) between two snapshots."""
    out = []
    for k, v in before.items():
        w = after.get(k)
        if v is None and w is None:
            continue
        if v is None or w is None or v.shape != w.shape or not np.array_equal(v, w):
            out.append(k)
    return out


def _same_number(a, b, rel_tol: float) -> bool:
    """Equal, both NaN, or (real numbers) within rounding: a value recomputed from the same batch
    in another order (a monitored mean) moves by a few ulps of the check's dtype; a counter or an
    annealed β moves by more."""
    if a == b or (a != a and b != b):
        return True
    if isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral):
        return False
    if not (isinstance(a, numbers.Real) and isinstance(b, numbers.Real)):
        return False  # (complex)
    return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=0.0)


def scalar_changes(before: dict, after: dict, dtype: str = "float64") -> list[str]:
    """The public numbers that changed beyond the rounding of a ``dtype`` computation."""
    rel_tol = 1e-12 if dtype == "float64" else 1e-5
    return [f"{k} changed from {before[k]!r} to {after[k]!r}" for k in before
            if k in after and not _same_number(before[k], after[k], rel_tol)]


__all__ = ["AuxLog", "grad_problem", "max_gap", "magnitude", "nonzero", "changed", "scalar_changes", "PASS", "FAIL", "NA"]
