"""Checker settings: dtype, finite-difference step, tolerances, mode, and their defaults."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np

from ..backend import DEVICES
from ..errors import UsageError
from ..registry.options import did_you_mean
from . import device as devices, kinks
from .inputs import DIM_CONFIGS

# dtype -> (eps, atol, rtol). float64: PyTorch's defaults; float32: a step large enough to rise
# above rounding noise, and loose tolerances (JAX f32 2e-3, MXNet rtol 1e-2). The step belongs to
# the dtype the differences are taken in: a float32 check differences a float64 copy (gradcheck.twin)
# with float64's step, and float32's only where no copy can stand in.
DEFAULTS = {"float64": (1e-6, 1e-5, 1e-3), "float32": (1e-3, 1e-3, 1e-2)}
# --strict (float64): cs231n's "1e-7 and less, you should be happy"; correct smooth layers
# measure ≤ 4e-8 (docs/gradcheck.md)
STRICT = (1e-7, 1e-6)
# the reentrant check's default: numpy's backward is deterministic; CuPy's atomic adds are not
NONDET_TOL = {"cpu": 0.0, "gpu": 1e-12}
F32_WARNING = ("float32 check: backward runs in float32 and is compared with central differences of a float64 "
               "copy at the same point; tolerances are float32's, looser than float64's, so a PASS here is weaker")
REPORTED = ("dtype", "eps", "atol", "rtol", "seed", "mode", "points")
MODES = ("auto", "exhaustive", "fast", "sampled", "jacobian")
PHASES = ("auto", "train", "eval", "both")


@dataclass(frozen=True)
class Settings:
    """How a check runs. ``None`` tolerances take the dtype's defaults (see :func:`resolve`).

    Each field but ``float32_eps`` and ``float32_kink_margin`` is an option of ``dlrun
    gradcheck`` (``--kink-margin`` for ``kink_margin``), documented by its entry below: the
    command's ``--help`` shows these texts.

    Args:
        dtype: float64 (default) or float32 (warns; loose tolerances): float32 backward is compared
            with central differences of a float64 copy.
        eps: Finite-difference step (default 1e-6; 1e-3 where a float32 check cannot difference a
            float64 copy).
        float32_eps: the step where a float32 check must difference in float32 (no float64 copy
            can stand in): ``eps`` when given, else 1e-3. Set by :meth:`resolved`.
        atol: Absolute tolerance (float64 1e-5, float32 1e-3): an element passes when
            |analytic - numeric| <= atol + rtol·|numeric|.
        rtol: Relative tolerance (float64 1e-3, float32 1e-2).
        seed: Seed of inputs, parameters, upstream gradients and layer randomness.
        mode: auto (exhaustive up to --max-exhaustive elements, else fast + sampled), exhaustive,
            fast (random directions per tensor), sampled, or jacobian (every entry of the full
            Jacobian, naming the output: for debugging small layers).
        points: Random points per shape and phase, on the same layer instance.
        directions: Random directions per tensor in fast mode.
        samples: Elements per tensor in sampled mode.
        max_exhaustive: The largest total element count auto mode checks exhaustively.
        resample: Redraws of a point within --kink-margin of a declared kink or with over 1% of
            elements skipped at one.
        phase: auto (train and eval for layers whose forward depends on it), train, eval or both.
        strict: float64 tolerances atol 1e-7, rtol 1e-6 (smooth layers).
        dims: Check one shape configuration with these sizes instead of the two defaults (the
            others from the first default configuration).
        nondet_tol: Allowed difference between two backward passes after one forward, relative to
            the largest gradient entry (default 0 on cpu: identical; 1e-12 on gpu, whose atomic
            adds may sum in any order). PyTorch's nondet_tol.
        kink_margin: Redraw points whose declared kink_distance is at most this (default 10 steps:
            1e-5, or 1e-2 where a float32 check must difference in float32); 0 redraws only points
            exactly on a kink.
        float32_kink_margin: the margin where a float32 check must difference in float32 (no
            float64 copy can stand in): ``kink_margin`` when given, else 10 × ``float32_eps``
            (1e-2). Set by :meth:`resolved`.
        detect_kinks: Also sample at ±eps/2 and skip elements where a quadratic does not fit
            (kinks without a branch_signature); 2x the forwards.
        device: cpu, or gpu: run the checked code on CuPy (the comparison stays on the host in
            float64).
    """

    dtype: Literal["float64", "float32"] = "float64"
    eps: float | None = None
    float32_eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    seed: int = 0
    mode: str = "auto"
    points: int = 2
    directions: int = 4
    samples: int = 64
    max_exhaustive: int = 5000
    resample: int = 20
    phase: str = "auto"
    strict: bool = False
    dims: str | None = None
    nondet_tol: float | None = None
    kink_margin: float | None = None
    float32_kink_margin: float | None = None
    detect_kinks: bool = False
    device: str = "cpu"

    def resolved(self) -> "Settings":
        """A copy with the dtype's defaults filled in; raises UsageError for bad values."""
        if self.dtype not in DEFAULTS:
            raise UsageError(f"--dtype must be float64 or float32, got {self.dtype!r}")
        if self.mode not in MODES:
            raise UsageError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.phase not in PHASES:
            raise UsageError(f"--phase must be one of {', '.join(PHASES)}, got {self.phase!r}")
        for name, low in (("points", 1), ("directions", 1), ("samples", 1), ("resample", 0), ("seed", 0),
                          ("max_exhaustive", 0)):
            if getattr(self, name) < low:
                raise UsageError(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(self, name)}")
        self.dim_configs()  # raises UsageError for a bad --dims
        if self.strict and self.dtype != "float64":
            raise UsageError("--strict needs --dtype float64 (float32 rounding alone exceeds its tolerances)")
        eps, atol, rtol = DEFAULTS["float64"][0], *DEFAULTS[self.dtype][1:]
        if self.strict:
            atol, rtol = STRICT
        if self.device not in DEVICES:
            raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}"
                             f"{did_you_mean(self.device, DEVICES)}")
        nondet = NONDET_TOL[self.device] if self.nondet_tol is None else self.nondet_tol
        if not (nondet >= 0 and np.isfinite(nondet)):
            raise UsageError(f"--nondet-tol must be a non-negative number, got {nondet}")
        s = replace(self, nondet_tol=nondet, eps=eps if self.eps is None else self.eps,
                    float32_eps=next(v for v in (self.float32_eps, self.eps, DEFAULTS[self.dtype][0]) if v is not None),
                    atol=atol if self.atol is None else self.atol,
                    rtol=rtol if self.rtol is None else self.rtol)
        tenfold = lambda step: float(f"{10 * step:.12g}")  # noqa: E731  (1e-05, not 9.99…e-06)
        s = replace(s, kink_margin=tenfold(s.eps) if s.kink_margin is None else s.kink_margin,
                    float32_kink_margin=next(v for v in (self.float32_kink_margin, self.kink_margin,
                                                         tenfold(s.float32_eps)) if v is not None))
        for name in ("eps", "float32_eps", "atol", "rtol", "kink_margin", "float32_kink_margin"):
            v, step = getattr(s, name), name.endswith("eps")
            if not (v >= 0 and np.isfinite(v)) or (step and v == 0):
                raise UsageError(f"--{name.replace('_', '-')} must be a {'positive' if step else 'non-negative'} "
                                 f"number, got {v}")
        return s

    def dim_configs(self) -> list[dict]:
        """The shape configurations to check: the two defaults, or the one ``dims`` names."""
        if self.dims is None:
            return [dict(c) for c in DIM_CONFIGS]
        chosen, given = dict(DIM_CONFIGS[0]), set()
        for item in filter(None, (p.strip() for p in self.dims.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip()
            if name not in chosen:
                raise UsageError(f"--dims: unknown dim {name!r}{did_you_mean(name, list(chosen))}; "
                                 f"known dims: {', '.join(chosen)}")
            if not sep or not value.strip().isdigit() or int(value) < 1:
                raise UsageError(f"--dims: {item!r} must be NAME=POSITIVE_INTEGER, e.g. --dims N=7,D=3")
            if name in given:
                raise UsageError(f"--dims: {name} is given twice ({self.dims!r})")
            given.add(name)
            chosen[name] = int(value)
        return [chosen]

    def phases(self, has_phase: bool) -> tuple[str, ...]:
        """The phases to check a layer in (``has_phase``: its forward depends on training)."""
        if self.phase == "auto":
            return ("train", "eval") if has_phase else ("train",)
        return ("train", "eval") if self.phase == "both" else (self.phase,)

    def header(self, keys=None) -> dict:
        """The settings a report is headed by (resolved): ``keys`` (default REPORTED), and float32's
        step, --detect-kinks and the device where they apply."""
        head = {k: getattr(self, k) for k in keys or REPORTED}
        if self.dtype == "float32":  # eps: the float64 copy's step; float32_eps: where none can stand in
            head["float32_eps"] = self.float32_eps
        if self.detect_kinks:
            head["detect_kinks"] = True
        if self.device != "cpu":
            head["device"] = self.device
        return head

    def warnings(self) -> list[str]:
        """What a report should warn of because of these settings (float32, TF32 on the GPU)."""
        return ([F32_WARNING] if self.dtype == "float32" else []) + devices.warnings_for(self.device, self.dtype)

    def mode_for(self, total: int, jacobian: bool = True) -> str:
        """The mode for ``total`` checked elements: ``mode``, or for auto exhaustive up to
        ``max_exhaustive`` and fast+sampled above. ``jacobian=False``: a scalar function (a loss,
        a penalty, a model's loss), whose Jacobian is its gradient: jacobian mode is exhaustive."""
        if self.mode == "jacobian" and not jacobian:
            return "exhaustive"
        if self.mode != "auto":
            return self.mode
        return "exhaustive" if total <= self.max_exhaustive else "fast+sampled"

    def step(self, dtype: str) -> float:
        """The central-difference step for differences of outputs computed in ``dtype``: a float32
        check's float64 copy takes ``eps``, its float32 fallback ``float32_eps`` (resolved)."""
        return self.float32_eps if dtype == "float32" else self.eps

    def dodge(self):
        """A :class:`kinks.Dodge` for a check with these (resolved) settings."""
        return kinks.Dodge(self.kink_margin, self.float32_kink_margin if self.dtype == "float32" else None)

    def kink_test(self, dtype=None):
        """The test ``--detect-kinks`` asks for (resolved settings), or None; ``dtype``: of the
        outputs being differenced, when not the check's (float32's float64 twin)."""
        return kinks.KinkTest(self.atol, self.rtol, np.dtype(dtype or self.np_dtype)) if self.detect_kinks else None

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def as_dict(self) -> dict:
        return asdict(self)
