"""Where finite differences are taken: on the checked layer, or (float32) on a float64 copy of it.

A float32 forward carries a rounding error of about 2⁻²⁴ of its size, so a central difference
of float32 outputs is uncertain by about 2⁻²⁴·‖G ⊙ out‖₂ / eps: with many outputs per perturbed
element (BatchNorm, Conv2D) that alone exceeds the float32 tolerances, and correct layers fail.
As Chainer's ``check_backward`` does (``numerical_grad_dtype=float64`` in its FunctionTestCase),
a float32 check therefore differentiates a float64 *twin*: a new instance of the same layer, built
with the same options and shape, holding the float32 parameters and declared state exactly (every
float32 number is a float64 one), evaluated at the same point. The analytic gradient still comes
from the float32 layer's own backward, so what is checked is float32 backward against the exact
derivative, with nothing but float64 rounding and the step's truncation in between.

The twin is used only where it reproduces the float32 layer: its output at the point must agree
within TWIN_RTOL of the output's scale. A layer whose random draws depend on the dtype, or that
computes in float32 whatever it is given, does not; it is differentiated in float32 as before,
and the report says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..backend import to_host
from .compare import rounding_noise
from .harness import ContractError, Harness, LayerRaised
from .numeric import Probe

# how closely the twin's float64 output must match the float32 one: far above float32 rounding
# (~1e-7 of the output's scale), far below what another random mask or a wrong copy gives (~1)
TWIN_RTOL = 1e-3


@dataclass
class Side:
    """What the finite differences perturb and evaluate: a harness, its device copies of x and y,
    the arrays a tensor name stands for (``x`` and the trainable parameters), the kink signature
    and the output at the point, and the dtype those outputs are computed in."""

    harness: Harness
    x: Any
    y: Any
    arrays: dict = field(default_factory=dict)
    sig0: Any = None
    out0: np.ndarray | None = None
    dtype: str = "float64"

    def probe(self, g64: np.ndarray, settings) -> Probe:
        """L = Σ G ⊙ out at this side (see :func:`noise` for the allowance added to atol)."""
        h, x, y, step = self.harness, self.x, self.y, settings.step(self.dtype)
        return Probe(lambda: h.loss(x, y, g64), step, h.signature if h.signed else None, self.sig0,
                     settings.kink_test(self.dtype), lambda: h.parts(x, y, g64),
                     noise=noise(self.dtype, g64, self.out0, step))


def noise(dtype: str, g64, out, eps: float) -> float:
    """float64 differences: what rounding of L = Σ G ⊙ out alone can make of one (added to atol,
    and the scale of the relative rule). float32 ones get none: compare.explain_rounding notes
    rounding instead."""
    return rounding_noise(g64, out, eps, 2.0 ** -53) if dtype == "float64" else 0.0


def own_side(h: Harness, x, y, trainable: dict, sig0, out0, dtype: str) -> Side:
    """The checked layer differentiated in its own dtype (float64 checks, and the fallback)."""
    arrays = {"x": x, **{n: p.data for n, p in trainable.items()}}
    return Side(h, x, y, arrays, sig0, out0, dtype)


def float64_side(h: Harness, point, out0: np.ndarray, trainable: dict) -> Side | str:
    """The float64 twin of ``h.layer`` at ``point`` (host arrays), holding the layer's current
    parameters and frozen state; or a one-line reason why the twin cannot stand in for it."""
    layer = h.layer
    if h.twin is None:
        if h.fresh is None:
            return "no new instance of the layer can be made"
        try:
            h.twin = Harness(h.fresh(np.float64), h.seed, h.device)
        except Exception as e:  # the layer's own build refused float64: differentiate float32
            return f"building it in float64 raised {type(e).__name__}: {e}"
    ref, copy = h.twin, h.twin.layer
    try:
        for n, p in layer.params.items():
            q = copy.params.get(n)
            if q is None or q.data.shape != p.data.shape:
                return f"its float64 instance has no parameter {n} of shape {tuple(p.data.shape)}"
            q.data[...] = p.data
        ref.frozen = {k: as64(v) for k, v in h.frozen.items()}
    except Exception as e:
        return f"copying its parameters and state raised {type(e).__name__}: {e}"
    copy.training = layer.training
    ref.where = h.where
    x = h.device.put(as64(point.x))
    y = None if point.y is None else h.device.put(np.array(point.y, copy=True))
    try:
        out = ref.forward(x, y)
        sig0 = ref.signature()
    except (LayerRaised, ContractError) as e:
        return f"its float64 instance raised: {e}"
    out64 = np.asarray(to_host(out), dtype=np.float64)
    problem = disagreement(out64, out0) or _stuck_in_float32(ref, x, y, out64)
    if problem:
        return problem
    arrays = {"x": x, **{n: copy.params[n].data for n in trainable}}
    return Side(ref, x, y, arrays, sig0, out64, "float64")


# a relative step float64 resolves (2⁻⁵³ ≈ 1e-16) and float32 loses (2⁻²⁴ ≈ 6e-8)
RESOLUTION_STEP = 1e-9


def _stuck_in_float32(ref: Harness, x, y, out64: np.ndarray) -> str | None:
    """Why the twin computes in float32 whatever it is given, or None: its output does not move
    at all when every input element moves by RESOLUTION_STEP of itself (a layer that casts its
    input to float32 loses such a step). Its differences, taken with float64's step 1e-6 on a
    float32-rounded function, would fail a correct backward; float32's step must be used."""
    if getattr(getattr(x, "dtype", None), "kind", "") != "f" or not out64.size or not (x != 0).any():
        return None  # indices, nothing to compare, or nothing a relative step moves
    try:  # (x holds float32 values exactly: x·(1 + 1e-9) rounds back to them in float32)
        moved = np.asarray(to_host(ref.forward(x * (1.0 + RESOLUTION_STEP), y)), dtype=np.float64)
        ref.forward(x, y)  # leave its caches as the point left them
    except (LayerRaised, ContractError):
        return None
    if np.array_equal(moved, out64):
        return (f"its output does not move when the input moves by {RESOLUTION_STEP:g} of itself, which float64 "
                f"resolves: it computes in float32 whatever it is given")
    return None


def disagreement(out64, out32) -> str | None:
    """Why a float64 twin's output ``out64`` cannot stand in for the float32 ``out32``, or None:
    every element must agree within TWIN_RTOL of its own size plus the output's largest."""
    out64, out32 = np.asarray(out64, dtype=np.float64), np.asarray(out32, dtype=np.float64)
    if out64.shape != out32.shape:
        return f"its float64 output has shape {out64.shape}, the float32 one {out32.shape}"
    gap = np.abs(out64 - out32)
    scale = float(np.abs(out64).max()) if out64.size else 0.0
    if np.all(gap <= TWIN_RTOL * (np.abs(out64) + scale)):  # (NaN fails)
        return None
    worst = float(np.nanmax(gap)) if np.isfinite(gap).any() else float("nan")
    return (f"its float64 output differs from the float32 one by up to {worst:.2g} (output scale {scale:.2g}): "
            f"random draws that depend on the dtype, or a computation that does not follow it")


def as64(v):
    """Float arrays as float64 copies (exact for float32 values); everything else as it is."""
    return v.astype(np.float64) if getattr(getattr(v, "dtype", None), "kind", "") == "f" else v


FALLBACK = ("{name}: a float64 copy cannot stand in for the float32 one ({why}); its finite differences are "
            "taken in float32, with step {step:g}, whose rounding (about 2⁻²⁴·‖G ⊙ out‖₂ / eps) can fail correct code")


def warn_fallback(warnings: list, name: str, why: str | None, step: float) -> None:
    """Add FALLBACK for ``name`` once (the first reason found), when there is a reason; ``step``:
    the float32 differences' (Settings.float32_eps)."""
    head = FALLBACK.split(" (")[0].format(name=name)
    if why and not any(w.startswith(head) for w in warnings):
        warnings.append(FALLBACK.format(name=name, why=why, step=step))


SCALAR_FALLBACK = ("differences taken in float32 with step {step:g}: a float64 copy cannot stand in ({why}), "
                   "and float32 rounding of the value (about 2⁻²⁴·|value| / eps) can fail a correct gradient")


@dataclass
class ScalarSide:
    """Where a scalar function (a loss, a penalty, a whole model's loss) is differenced: its
    value, the arrays it reads by tensor name (perturbed in place), the dtype its values are
    computed in, notes, and the kink signature with its value at the point (a model's)."""

    value: Callable[[], float]
    arrays: dict
    dtype: str
    notes: list = field(default_factory=list)
    signature: Callable[[], Any] | None = None
    sig0: Any = None

    def probe(self, settings) -> Probe:
        step = settings.step(self.dtype)
        allowance = noise(self.dtype, np.ones(1), [self.value()], step)
        return Probe(self.value, step, self.signature, self.sig0, settings.kink_test(self.dtype),
                     lambda: np.array([self.value()]), noise=allowance)


def scalar_side(value32: Callable[[], float], value64: Callable[[], float], arrays32: dict, arrays64: dict,
                raised: type[Exception], step: float) -> ScalarSide:
    """A float32 check's side: ``value64`` (a float64 copy, reading ``arrays64``) when its value
    agrees with ``value32``'s; else ``value32`` itself, with a note naming ``step`` (float32's).
    ``raised``: what the copy's own code raises (its message is the reason)."""
    try:
        why = disagreement([value64()], [value32()])
    except raised as e:
        why = f"its float64 instance raised: {e}"
    if why is None:
        return ScalarSide(value64, arrays64, "float64")
    return ScalarSide(value32, arrays32, "float32", [SCALAR_FALLBACK.format(why=why, step=step)])
