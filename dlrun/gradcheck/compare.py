"""Comparing backward's gradient with finite differences: the tolerance rule, the symmetric
relative error, non-finite values and the float64 relative rule, recorded in a TensorRun."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import diagnose
from .report import Worst

TINY = 1e-10  # cs231n: a numeric gradient this small everywhere is suspect, not a match


@dataclass
class TensorRun:
    """One tensor checked at one point."""

    name: str
    role: str
    shape: tuple
    dtype: str
    mode: str
    checked: int = 0
    skipped: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    sym_rel: float = 0.0
    worst: Worst | None = None
    largest: Worst | None = None  # the element with the largest abs(a − n) (what a PASS shows)
    failed: bool = False
    notes: list = field(default_factory=list)


def compare(run: TensorRun, a: np.ndarray, n: np.ndarray, flat: np.ndarray, atol: float, rtol: float,
            where: str, noise: float = 0.0) -> None:
    """Elementwise abs(a − n) <= atol + rtol·abs(n); record maxima and the worst element. A
    non-finite value fails; with float64's rounding bound ``noise`` (per element) the relative
    rule applies too."""
    if flat.size == 0:
        return
    finite = np.isfinite(a) & np.isfinite(n)
    if not finite.all():  # NaN compares false with every tolerance: it must fail, not pass
        k = int(np.argmin(finite))
        idx = tuple(int(i) for i in np.unravel_index(int(flat[k]), run.shape))
        run.failed = True
        run.max_abs = run.sym_rel = float("inf")  # shown as inf (JSON: null), read as "wrong"
        ref = n[k] if np.isfinite(n[k]) else a[k] if np.isfinite(a[k]) else 0.0
        run.worst = Worst(idx, float(a[k]), float(n[k]), float(atol + rtol * abs(ref)), where)
        note = (f"backward's gradient for {run.name} is NaN or inf" if not np.isfinite(a[k]) else
                f"finite differences for {run.name} are NaN or inf: forward's output is not finite at or next "
                f"to the point")
        note += " (the worst element shows the first such element)"
        if note not in run.notes:
            run.notes.append(note)
        a, n, flat = a[finite], n[finite], flat[finite]
        if flat.size == 0:
            return
    diff = np.abs(a - n)
    tol = atol + rtol * np.abs(n)
    big = np.maximum(np.abs(a), np.abs(n))
    rel = np.where(big < 1e-12, 0.0, diff / np.where(big == 0, 1.0, big))
    sym = sym_rel(a, n)
    run.max_abs = max(run.max_abs, float(diff.max()))
    run.max_rel = max(run.max_rel, float(rel.max()))
    run.sym_rel = max(run.sym_rel, sym)
    if finite.all():  # (a non-finite element, when there is one, stays the worst)
        run.worst = _element(run, a, n, tol, flat, int(np.argmax(diff - tol)), where)
    k = int(np.argmax(diff))
    if run.largest is None or diff[k] > abs(run.largest.analytic - run.largest.numeric):
        run.largest = _element(run, a, n, tol, flat, k, where)
    if (diff > tol).any():
        run.failed = True
        pattern = diagnose.describe(run.name, run.shape, a, n, flat, diff > tol)
        if pattern and pattern not in run.notes:
            run.notes.append(pattern)
    elif not run.failed:
        relative_rule(run, sym, float(np.linalg.norm(a - n)), noise * np.sqrt(a.size), atol)
    if not n.any() and np.abs(a).max() > atol:
        run.notes.append(f"numeric gradient is exactly 0 everywhere but backward's is not: "
                         f"perturbing {run.name} does not reach the output (not wired, or a copy is used?)")
    elif np.abs(n).max() < TINY and np.abs(a).max() > atol:
        run.notes.append(f"numeric gradient is below {TINY:.0e} everywhere but backward's is not: the "
                         f"output hardly moves with {run.name} (a factor missing in forward, or values "
                         f"outside floating point's active range: scale them up)")


def _element(run: TensorRun, a, n, tol, flat, k: int, where: str) -> Worst:
    idx = tuple(int(i) for i in np.unravel_index(int(flat[k]), run.shape))
    return Worst(idx, float(a[k]), float(n[k]), float(tol[k]), where)


def sym_rel(a: np.ndarray, n: np.ndarray) -> float:
    """‖a − n‖₂ / ‖a + n‖₂ (Oxford's measure, "of the order of eps" when right); 0 when both
    are (near) zero, huge when a = −n."""
    den = float(np.linalg.norm(a + n))
    num = float(np.linalg.norm(a - n))
    return 0.0 if den < 1e-12 and num < 1e-12 else num / max(den, 1e-300)  # finite: valid JSON


def relative_rule(run: TensorRun, rel: float, gap: float, noise: float, atol: float) -> None:
    """float64 (noise > 0): every element may sit inside atol only because the gradients are small
    (a layer scaled by 1e-6), while backward and the differences disagree by a percent or more,
    a thousand times beyond rounding. That is a bug at any scale: FAIL it."""
    if noise > 0 and rel >= RELATIVE_FAIL and gap > 1e3 * noise:
        run.failed = True
        note = (f"{run.name}: backward and finite differences disagree by sym rel {rel:.2g} (≥ {RELATIVE_FAIL:g}, over "
                f"a thousand times what rounding explains), though within the tolerance: atol={atol:.1e} dwarfs small "
                f"gradients, and a tolerance along a random direction spans the whole tensor")
        if note not in run.notes:  # (no place in it: one note per tensor; the worst element has the place)
            run.notes.append(note)


RELATIVE_FAIL = 1e-2  # cs231n's "wrong" band; correct float64 layers reach 5e-9


ROUNDING_NOTE = ("its failures are within float32 rounding of the finite differences (4·2⁻²⁴·‖G ⊙ out‖₂ / eps): "
                 "rerun with --dtype float64 to tell a bug from rounding")


def rounding_noise(g64, out0, eps: float, u: float) -> float:
    """4·u·‖G ⊙ out‖₂ / eps: how far rounding of L = Σ G ⊙ out (each output uncertain by about u of
    its size) can move a central difference."""
    return 4 * u * float(np.linalg.norm(g64.ravel() * np.asarray(out0, dtype=np.float64).ravel())) / eps


def explain_rounding(runs, g64, out0, eps: float) -> None:
    """float32: a FAIL whose worst gap is within what rounding of L alone can make of a difference
    (≈ 4·u·‖G ⊙ out‖₂ / h, u = 2⁻²⁴) gets a note saying so; the verdict is unchanged."""
    noise = rounding_noise(g64, out0, eps, 2.0 ** -24)
    for r in runs:
        w = r.worst
        if r.failed and w is not None and abs(w.analytic - w.numeric) <= w.tol + noise:
            r.notes.append(ROUNDING_NOTE)
