"""Kinks: elements whose finite difference crosses a branch change are skipped, not compared.

A layer with a kink (ReLU at 0, LargeMarginFC where the target logit changes sign) returns its
branch choices from ``branch_signature()``: a mask, an argmax, or a tuple of those. When the
signature after a forward at θ+h or θ−h differs from the one at θ, the two-sided difference
straddles the kink and says nothing about either branch's derivative (cs231n's "winners"
check). The element is counted as skipped; a point with more than 1% skipped is redrawn.

Before that, a layer (loss, regularizer) that declares ``kink_distance()`` has its point redrawn
(up to ``--resample`` times) while the point lies within ``--kink-margin`` of a kink (Chainer's
``dodge_nondifferentiable``): a point far from every kink loses no element to skipping.

A layer without a signature (a user's plugin) can opt into generic detection, ``--detect-kinks``
(Chainer's ``detect_nondifferentiable``): the function is also evaluated at θ ± h/2, a quadratic is
fitted through the five values, and a residual too large for a smooth function marks a kink.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import to_host
from ..layers.base import Layer

MAX_SKIPPED = 0.01
# The least RMS residual of the five-point quadratic fit, per unit of the central-difference error
# a kink causes: for a slope change Δ at t0 in (-h, h) the error is Δ(h - |t0|)/2h and the residual
# at least KAPPA·2h times that (minimised over t0 numerically: 0.0426). With the threshold
# KAPPA·h·tol every kink that moves a difference by more than tol/2 is detected.
KAPPA = 0.042
# Rounding: a residual below FLOOR·eps·|value| (eps of the layer's dtype) is noise, not a kink.
FLOOR = 8.0


def declares(obj, hook: str, base) -> bool:
    """Whether ``obj``'s class overrides the hook ``base`` defines (kink_distance, ...)."""
    return getattr(type(obj), hook, None) is not getattr(base, hook)


@dataclass
class Dodge:
    """Redrawing points that lie within ``margin`` of a declared kink, and the count of them.

    ``fallback_margin`` (float32 checks): the wider margin for a point whose differences are
    taken in float32 with float32's larger step, because no float64 copy could stand in. Whether
    one can is known only once the point is evaluated, so such a point is checked against the
    wider margin again afterwards (:meth:`recheck`).

    ``redrawn``: points drawn again for being too close; ``near``: points checked although
    still too close after every redraw (their crossing elements are then skipped, if the layer
    has a signature, or compared: a failure there may be the kink's); ``crossed``: points drawn
    again because over 1% of their differences crossed a kink (the caller counts them).
    """

    margin: float
    fallback_margin: float | None = None
    redrawn: int = 0
    near: int = 0
    crossed: int = 0
    declared: bool = False
    widened: bool = False  # a point was held to fallback_margin

    def redraw(self, distance, final: bool, fallback: bool = False) -> bool:
        """Whether to draw the point again, given its declared distance (None: smooth);
        ``fallback``: its differences are known to be taken in float32."""
        d = self._least(distance)
        if d is None:
            return False
        margin = self._margin(fallback)
        return self._verdict(not d > margin, final)  # NaN counts as close

    def recheck(self, distance, final: bool) -> bool:
        """After the point turned out to fall back to float32 differences: whether to draw it
        again for being within ``fallback_margin`` (beyond ``margin``, which :meth:`redraw`
        already judged)."""
        d = self._least(distance)
        if d is None or self.fallback_margin is None:
            return False
        return self._verdict(d > self.margin and not d > self._margin(True), final)

    def _least(self, distance) -> float | None:
        if distance is None:
            return None
        self.declared = True
        d = np.asarray(to_host(distance), dtype=np.float64)
        return float(d.min()) if d.size else float("inf")

    def _margin(self, fallback: bool) -> float:
        if fallback and self.fallback_margin is not None:
            self.widened = True
            return self.fallback_margin
        return self.margin

    def _verdict(self, close: bool, final: bool) -> bool:
        if close and not final:
            self.redrawn += 1
            return True
        self.near += close
        return False

    def annotate(self, report) -> None:
        """Record the counts (``report.kinks``) when something declared a distance or a point was
        redrawn for crossing kinks, and the margins (its settings) when something declared a
        distance; a smooth layer's report stays as it was."""
        if self.declared or self.crossed:
            report.kinks = {"margin": self.margin, "redrawn": self.redrawn, "near": self.near, "crossed": self.crossed}
        if self.declared:
            report.settings["kink_margin"] = self.margin
            if self.widened:
                report.kinks["float32_margin"] = report.settings["float32_kink_margin"] = self.fallback_margin


def has_signature(layer) -> bool:
    """Whether the layer overrides ``branch_signature`` (smooth layers do not)."""
    return declares(layer, "branch_signature", Layer)


def freeze(sig):
    """A host copy of a signature, so later forwards cannot change it under us."""
    if sig is None:
        return None
    if isinstance(sig, (tuple, list)):
        return tuple(freeze(s) for s in sig)
    if isinstance(sig, dict):
        return {k: freeze(v) for k, v in sig.items()}
    if hasattr(sig, "shape"):
        return np.array(to_host(sig), copy=True)
    return sig


def same(a, b) -> bool:
    """Whether two frozen signatures are equal (arrays elementwise, containers recursively)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.shape(a) == np.shape(b) and bool(np.array_equal(a, b))
    return a == b


def too_many_skipped(skipped: int, checked: int) -> bool:
    """More than 1% of the compared elements skipped: redraw the point."""
    total = skipped + checked
    return total > 0 and skipped > MAX_SKIPPED * total


@dataclass(frozen=True)
class KinkTest:
    """``--detect-kinks``: the tolerances a kink is measured against and the layer's dtype."""

    atol: float
    rtol: float
    dtype: np.dtype


def _projector() -> np.ndarray:
    """I − V V⁺ for the Vandermonde matrix V of the steps (−1, −½, 0, ½, 1): it maps five samples
    to the residuals of their least-squares quadratic."""
    v = np.vander(np.array([-1.0, -0.5, 0.0, 0.5, 1.0]), 3)
    return np.eye(5) - v @ np.linalg.pinv(v)


RESIDUAL = _projector()


def _residual(ts: np.ndarray, y: np.ndarray) -> np.ndarray:
    """RMS residual of the least-squares quadratic through (ts, y[:, k]) for every column k.

    ``ts`` are the steps actually stored (h units), a rounding away from (−1, −½, 0, ½, 1): the
    chord slope through the outer samples is removed with the real steps first, so the fixed
    projector sees only the curvature and the kinks.
    """
    slope = (y[-1] - y[0]) / (ts[-1] - ts[0])
    r = RESIDUAL @ (y - ts[:, None] * slope)
    return np.sqrt(np.einsum("ij,ij->j", r, r) / len(ts))


def nondifferentiable(test: KinkTest, ts, parts, numeric, h: float, vector: bool) -> bool:
    """Whether the five samples (steps ``ts``, one of them 0) show a kink.

    ``parts``: (5, m) float64 values. For a scalar loss they are its terms (their sum is the loss)
    and ``numeric`` is the loss's central difference; for a vector loss (``--mode jacobian``) each
    column is one output and ``numeric`` its difference. A kink is a change of finiteness, or a fit
    residual above KAPPA·h·tol in a column (or in the sum of the columns that moved) that is
    also above rounding: FLOOR·eps·max|value| (√moved times that for the sum), with the largest
    value of all columns, since an output can be a cancelling sum of larger terms.
    """
    ts = np.asarray(ts, dtype=np.float64) / h
    y = np.asarray(parts, dtype=np.float64).reshape(len(ts), -1)
    finite = np.isfinite(y)
    if (finite != finite[:1]).any():
        return True
    tol = test.atol + test.rtol * np.abs(np.asarray(numeric, dtype=np.float64))
    moved = finite[0] & (y != y[:1]).any(axis=0)
    if not moved.any():
        return False
    if vector:
        tol = tol.ravel()[moved]
    y = y[:, moved]
    noise = FLOOR * float(np.finfo(test.dtype).eps) * float(np.abs(y).max())
    if (_residual(ts, y) > np.maximum(KAPPA * h * tol, noise)).any():
        return True
    if vector:
        return False
    total = y.sum(axis=1, keepdims=True)
    return bool(_residual(ts, total)[0] > max(KAPPA * h * float(tol), noise * np.sqrt(y.shape[1])))
