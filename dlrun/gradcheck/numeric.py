"""Central differences written into the array the layer actually reads, compared with backward.

For L(θ) = Σ G ⊙ f(θ) with a random upstream gradient G, the numeric derivative of element e is
(L(θ + h·e) − L(θ − h·e)) / (h₊ + h₋), where h₊, h₋ are the steps actually stored (they differ
from h in float32). The saved value is copied back exactly after each element: restoring by
arithmetic (+h, −2h, +h) leaves many elements an ulp off.

Modes (per tensor, so a failure names its tensor):
* exhaustive: every element;
* sampled: ``samples`` elements, always the first and the last (plus caller-chosen ones);
* fast: ``directions`` random unit directions u; (L(θ+hu) − L(θ−hu))/2h against ⟨grad, u⟩,
  passing when the gap is within atol·√n + rtol·‖grad‖ (the Cauchy–Schwarz image of the
  elementwise rule, as in PyTorch's fast mode).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..backend import array_module, to_host
from ..errors import UsageError
from . import kinks
from .compare import TensorRun, compare, relative_rule, sym_rel


@dataclass
class Probe:
    """The function being differentiated (the scalar Σ G ⊙ out, or for ``--mode jacobian`` the
    whole output as a float64 vector), the step ``h`` its differences take (that of the dtype
    its outputs are computed in: Settings.step), and the kink signature at the base point."""

    loss: Callable[[], Any]
    h: float
    signature: Callable[[], Any] | None = None
    sig0: Any = None
    # --detect-kinks: ``parts()`` gives float64 terms whose sum is the loss (a vector loss: the
    # loss itself, ``vector``), sampled at θ ± h/2 as well and tested by kinks.nondifferentiable
    kink_test: kinks.KinkTest | None = None
    parts: Callable[[], np.ndarray] | None = None
    vector: bool = False
    center: np.ndarray | None = None
    # float64: what rounding of L alone can make of a difference, added to atol so that a correct
    # layer with large outputs does not fail --strict (tiny for outputs of order 1: see runner)
    noise: float = 0.0

    def value(self, parts: np.ndarray):
        return parts if self.vector else float(parts.sum())


def _crossed(probe: Probe) -> bool:
    return probe.signature is not None and not kinks.same(probe.signature(), probe.sig0)


def _difference(probe: Probe, put: Callable[[float], float], h: float):
    """(L(+h) − L(−h)) / (h₊ + h₋) and whether a kink lies between; ``put(t)`` writes θ + t·direction
    and returns the step actually stored. With a kink test, θ ± h/2 are sampled too (the
    derivative stays the ±h difference: at these steps rounding, not truncation, limits it, and
    a five-point formula would amplify the rounding)."""
    if probe.kink_test is None:
        hp = put(h)
        lp = probe.loss()
        crossed = _crossed(probe)
        hm = -put(-h)
        lm = probe.loss()
        return (lp - lm) / _span(hp + hm, h), crossed or _crossed(probe)
    if probe.center is None:  # the terms at θ itself, the fifth sample of every fit
        probe.center = probe.parts()
    ts, parts, crossed = [], [], False
    for t in (-h, -h / 2, h / 2, h):
        ts.append(put(t))
        parts.append(probe.parts())
        crossed = crossed or _crossed(probe)
    numeric = (probe.value(parts[3]) - probe.value(parts[0])) / _span(ts[3] - ts[0], h)
    stack = np.stack([parts[0], parts[1], probe.center, parts[2], parts[3]])
    kinked = kinks.nondifferentiable(probe.kink_test, [ts[0], ts[1], 0.0, ts[2], ts[3]], stack, numeric, h,
                                     probe.vector)
    return numeric, crossed or kinked


def _span(stored: float, h: float) -> float:
    """The step actually taken, which must not have rounded away (|θ| far above eps)."""
    if stored == 0:
        raise UsageError(f"--eps {h:g}: θ ± eps rounds back to θ (the step is below the spacing of floating-point "
                         f"numbers at the checked values); use a larger --eps")
    return stored


def element_derivative(probe: Probe, arr, idx: tuple, h: float) -> tuple[float, bool]:
    """(numeric ∂L/∂arr[idx], whether the difference crossed a kink); arr[idx] is restored exactly.
    ``arr`` is numpy or a device array (each write and read-back is then a small transfer).
    L may be an array (each entry differentiated), which must be a copy, not a view of ``arr``."""
    orig = arr[idx].copy()

    def put(t):
        arr[idx] = orig + t
        return float(arr[idx]) - float(orig)

    try:
        return _difference(probe, put, h)
    finally:
        arr[idx] = orig


def direction_derivative(probe: Probe, arr, grad: np.ndarray, u: np.ndarray, h: float):
    """(numeric, analytic, crossed) derivatives along the unit direction u (host float64); ``arr``
    (numpy or a device array) is restored exactly."""
    saved = arr.copy()
    base = np.array(to_host(arr), dtype=np.float64)
    xp = array_module(arr)
    steps = {}

    def put(t):  # the step along u actually stored (float32 rounds each element)
        arr[...] = xp.asarray((base + t * u).astype(arr.dtype))
        steps[t] = np.asarray(to_host(arr), dtype=np.float64) - base
        return float(np.dot(u.ravel(), steps[t].ravel()))

    try:
        num, crossed = _difference(probe, put, h)
    finally:
        arr[...] = saved
    span = (steps[h] - steps[-h]).ravel()
    return num, float(np.dot(grad.ravel(), span)) / _span(float(np.dot(u.ravel(), span)), h), crossed


def check_elements(probe: Probe, arr, grad, flat: np.ndarray, run: TensorRun, h, atol, rtol, where) -> None:
    """Exhaustive or sampled check of the elements ``flat`` (flat indices)."""
    keep, nums = [], []
    for f in flat:
        idx = np.unravel_index(int(f), arr.shape)
        d, crossed = element_derivative(probe, arr, idx, h)
        if crossed:
            run.skipped += 1
            continue
        keep.append(int(f))
        nums.append(d)
    flat = np.asarray(keep, dtype=np.int64)
    run.checked += flat.size
    compare(run, np.asarray(grad, dtype=np.float64).ravel()[flat], np.asarray(nums, dtype=np.float64),
            flat, atol, rtol, where, probe.noise)


def check_directions(probe: Probe, arr, grad, count: int, rng, run: TensorRun, h, atol, rtol, where) -> None:
    """Fast mode: ``count`` random unit directions (a direction crossing a kink is redrawn twice)."""
    g = np.asarray(grad, dtype=np.float64)
    tol = atol * np.sqrt(arr.size) + rtol * float(np.linalg.norm(g))
    for r in range(count):
        for _ in range(3):
            u = rng.standard_normal(arr.shape)
            u /= np.linalg.norm(u)
            num, ana, crossed = direction_derivative(probe, arr, g, u, h)
            if not crossed:
                break
        if crossed:
            run.skipped += 1
            continue
        run.checked += 1
        gap = abs(ana - num)
        if not np.isfinite(gap):
            run.failed = True
            run.notes.append(f"direction {r + 1}: backward gives {ana:.6g}, finite differences {num:.6g}: not finite "
                             f"({'backward' if not np.isfinite(ana) else 'forward'} produced NaN or inf) at {where}")
            continue
        rel = sym_rel(np.array([ana]), np.array([num]))
        run.sym_rel = max(run.sym_rel, rel)
        relative_rule(run, rel, gap, probe.noise, atol)
        if gap > tol:
            run.failed = True
            run.notes.append(f"direction {r + 1}: backward gives {ana:.6g}, finite differences {num:.6g} "
                             f"(gap {gap:.2e} > tol {tol:.2e}) at {where}")


def sample_indices(size: int, count: int, rng, extra=()) -> np.ndarray:
    """First, last, ``extra`` and random distinct flat indices, sorted (all of them if few)."""
    if size <= count:
        return np.arange(size)
    chosen = {0, size - 1, *[int(e) for e in extra if 0 <= e < size]}
    rest = rng.permutation(size)
    for f in rest:
        if len(chosen) >= count:
            break
        chosen.add(int(f))
    return np.array(sorted(chosen), dtype=np.int64)


def check_tensor(probe: Probe, arr, grad, name: str, role: str, mode: str, settings, rng, where: str,
                 extra=(), dtype: str | None = None) -> TensorRun:
    """Check one tensor in ``mode`` (exhaustive, fast, sampled or fast+sampled). ``arr`` is the
    array the probe reads; ``dtype``, the checked tensor's when ``arr`` is a float64 twin's."""
    run = TensorRun(name, role, tuple(arr.shape), dtype or str(arr.dtype), mode)
    h, atol, rtol = probe.h, settings.atol + probe.noise, settings.rtol
    if mode == "exhaustive":
        check_elements(probe, arr, grad, np.arange(arr.size), run, h, atol, rtol, where)
    if "sampled" in mode:
        flat = sample_indices(arr.size, settings.samples, rng, extra)
        check_elements(probe, arr, grad, flat, run, h, atol, rtol, where)
    if "fast" in mode:
        check_directions(probe, arr, grad, settings.directions, rng, run, h, atol, rtol, where)
        if mode == "fast" and run.failed:
            _locate(probe, arr, grad, run, settings, rng, where, extra)
    return run


def _locate(probe: Probe, arr, grad, run: TensorRun, settings, rng, where: str, extra) -> None:
    """A failed direction names no element: check ``samples`` elements to find the worst one
    (PyTorch's fast mode reruns the slow one for the same reason)."""
    found = TensorRun(run.name, run.role, run.shape, run.dtype, "sampled")
    flat = sample_indices(arr.size, settings.samples, rng, extra)
    check_elements(probe, arr, grad, flat, found, probe.h, settings.atol + probe.noise, settings.rtol, where)
    run.checked += found.checked
    run.skipped += found.skipped
    run.max_abs, run.max_rel = max(run.max_abs, found.max_abs), max(run.max_rel, found.max_rel)
    run.sym_rel, run.worst, run.largest = max(run.sym_rel, found.sym_rel), found.worst, found.largest
    run.mode = "fast+sampled"
    run.notes.insert(0, f"to locate the failure, {found.checked} elements were checked one by one: "
                     + ("the worst is shown" if found.failed else
                        "none of them fails, so the error is spread thin: rerun with --mode exhaustive"))
