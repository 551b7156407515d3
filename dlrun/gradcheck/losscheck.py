"""`dlrun gradcheck LOSS`: a registered loss's backward against central differences of its value.

A loss maps scores z (N, C) and targets y to the scalar L = loss.forward(z, y), the batch mean;
``backward()`` must return ∂L/∂z. So the checked function is L itself, with no upstream gradient.
Scores are N(0, 1). A classification loss gets int64 labels with every class present and a
repeat; if it refuses C score columns for C classes (``check_outputs``, as BinaryCrossEntropy
does for more than two) it is checked as a binary loss, one score column and labels 0/1. A
regression loss gets N(0, 1) targets of z's shape, and is also checked with one output
column and targets of shape (N,), as the trainer passes single-output data. The shape configurations, points, modes,
tolerances and ``--detect-kinks`` are those of the layer check (the Jacobian of a scalar is its
gradient, so ``--mode jacobian`` checks every element); the auxiliary checks that apply to a
loss are grad-structure, reentrant, inputs-unchanged and second-point.
"""
from __future__ import annotations

import time

import numpy as np

from .. import registry
from ..errors import UsageError
from ..backend import to_host
from ..model.contract import source_line
from ..losses.base import BALANCED
from . import auxiliary as aux, device as devices, inputs, kinks, twin
from .numeric import TensorRun, check_tensor
from .report import FAIL, PASS, LayerReport, TensorResult, merge, new_report
from .settings import Settings


class LossRaised(Exception):
    """The loss's own code raised or returned something that is not a scalar."""


def user_call(what: str, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # the loss's (or penalty's) own code: name the call and its line
        owner = getattr(fn, "__self__", None)
        at = source_line(owner, e) if owner is not None else ""
        raise LossRaised(f"{what} raised {type(e).__name__}: {e}{at}") from e


def kink_distance(obj, *args):
    """``obj.kink_distance(*args)`` (a loss's or a penalty's), or None when it has none."""
    hook = getattr(obj, "kink_distance", None)  # a plugin need not subclass the base
    return None if hook is None else user_call("kink_distance", hook, *args)


def _value(loss, z, y) -> float:
    v = user_call("forward", loss.forward, z, y)
    if np.ndim(to_host(v)) != 0:
        raise LossRaised(f"forward returned shape {np.shape(to_host(v))}, expected a scalar (the batch mean)")
    return float(v)


def targets(loss, n: int, classes: int, settings: Settings, rng) -> tuple[np.ndarray, np.ndarray]:
    """Scores z and targets y for one point (see the module docstring)."""
    if getattr(loss, "task", "classification") != "classification":
        z = rng.standard_normal((n, classes)).astype(settings.np_dtype)
        shape = (n,) if classes == 1 else (n, classes)  # one output: targets (N,), as the trainer passes them
        return z, rng.standard_normal(shape).astype(settings.np_dtype)
    columns = classes if loss.check_outputs(classes, classes) is None else 1
    labels = inputs.labels(n, classes if columns > 1 else 2, rng)
    return rng.standard_normal((n, columns)).astype(settings.np_dtype), labels


def _weighted_classes(loss, configs: list[dict], chosen: bool) -> list[dict]:
    """A loss with class_weights scores as many classes as it has weights: C is set to that
    (a C given with --dims must be it)."""
    weights = getattr(loss, "class_weights", None)
    if weights == BALANCED:
        raise UsageError("class_weights: balanced is computed from a run's training labels, and a loss check has none: "
                         "give the weights, e.g. --set class_weights=[1,2,0.5,1], or check a config (dlrun gradcheck "
                         "CONFIG.yaml computes them from its data)")
    if weights is None or loss.classes(len(weights)) != len(weights):  # (BinaryCrossEntropy: 2 with any C)
        return configs
    if chosen and configs[0]["C"] != len(weights):
        raise UsageError(f"--dims C={configs[0]['C']}, but the loss has {len(weights)} class_weights, one per class: "
                         f"give C={len(weights)}, or leave C out")
    return [{**c, "C": len(weights)} for c in configs]


def check_loss(name: str, options: dict | None = None, settings: Settings | None = None) -> LayerReport:
    """Gradient-check the registered loss ``name``; return a report (never prints)."""
    settings = (settings or Settings()).resolved()
    spec = {"type": name, **(options or {})}
    loss = registry.losses.build(spec, name)
    loss64 = registry.losses.build(spec, name) if settings.dtype == "float32" else None
    rng = np.random.default_rng(settings.seed)
    dev = devices.open_device(settings.device)
    given_c = any(p.partition("=")[0].strip() == "C" for p in (settings.dims or "").split(","))
    configs = _weighted_classes(loss, settings.dim_configs(), given_c)
    if getattr(loss, "task", "") == "regression" and settings.dims is None:
        configs.append({**configs[0], "C": 1})  # a single output, the shape of most regression data
    report = scalar_report(name, settings, configs, lambda d: f"N={d['N']} C={d['C']}",
                           lambda dims, where, log, dodge, final: _check_point(loss, dims, settings, rng, where, log,
                                                                               dev, dodge, final, loss64))
    if settings.dtype == "float64" and report.error is None:  # training runs in float32: see dtypes.py
        problem = _float32_problem(loss, configs[0], settings, dev)
        entry = next(a for a in report.aux if a.name == "float32")
        entry.status, entry.detail = (PASS, "") if problem is None else (FAIL, problem)
    return report


def _float32_problem(loss, dims: dict, settings: Settings, dev) -> str | None:
    """What the loss returns in float64 for float32 scores (dz; the trainer refuses it), or None."""
    z0, y0 = targets(loss, dims["N"], dims["C"], settings, np.random.default_rng(settings.seed))
    z = dev.put(z0.astype(np.float32))
    y = dev.put(y0.astype(np.float32) if y0.dtype.kind == "f" else y0)
    try:
        user_call("forward", loss.forward, z, y)
        dz = user_call("backward", loss.backward)
    except LossRaised as e:
        return f"in float32 the loss raised: {e}"
    if getattr(dz, "dtype", np.float32) == np.float32:
        return None
    return (f"with float32 scores (training's default) backward returns dz as {dz.dtype}: dlrun train refuses "
            f"that; keep the dtype (np.eye(C)[y] and Python-int arithmetic on bool arrays give float64)")


def scalar_report(name: str, settings: Settings, configs: list, where_of, check_point, extra=None) -> LayerReport:
    """The report of checking a scalar function (a loss, a penalty) at every configuration × point.

    ``check_point(dims, where, log, dodge, final)`` checks one random point and returns its
    TensorRun, or None to have it redrawn (``dodge.redraw`` said the point is within the kink
    margin; never when ``final``); a point with more than 1% of its elements at a kink is also
    redrawn (up to ``--resample`` times in all); second-point is recorded per configuration. A
    LossRaised becomes the report's error.
    """
    report = new_report(name, settings)
    report.settings.update(extra or {})
    results: dict[str, TensorResult] = {}
    log = aux.AuxLog()
    dodge = settings.dodge()
    t0 = time.perf_counter()
    try:
        for dims in configs:
            passed_first = False
            for p in range(settings.points):
                where = f"{where_of(dims)}, point {p + 1}"
                for attempt in range(settings.resample + 1):
                    point_log = aux.AuxLog()
                    run = check_point(dims, where, point_log, dodge, attempt == settings.resample)
                    if run is not None and not kinks.too_many_skipped(run.skipped, run.checked):
                        break
                    dodge.crossed += run is not None and attempt < settings.resample
                else:
                    problem = None if run is None else aux.skip_problem([run], settings.resample)
                    if problem and not settings.detect_kinks:  # (shown only when it fails)
                        point_log.record("kink-skips", False, problem, where)
                log.merge(point_log)
                if p == 0:
                    passed_first = not run.failed
                elif run.failed and passed_first:
                    log.record("second-point", False, f"{run.name} passes at point 1 but fails at point {p + 1} "
                               "(stale cache or accumulating buffer)", where)
                else:
                    log.record("second-point", True)
                merge(results, run)
    except LossRaised as e:
        report.error = str(e)
    report.tensors = list(results.values())
    report.aux = log.listing()
    dodge.annotate(report)
    report.seconds = time.perf_counter() - t0
    return report


def _check_point(loss, dims: dict, settings: Settings, rng, where: str, log: aux.AuxLog, dev, dodge, final,
                 loss64=None):
    """One point; ``loss64``: a float64 instance of the loss, differenced in a float32 check."""
    z0, y0 = targets(loss, dims["N"], dims["C"], settings, rng)  # on the host; the loss reads z, y
    z, y = dev.put(z0.copy()), dev.put(y0.copy())
    distance = kink_distance(loss, z, y)
    if dodge.redraw(distance, final):
        return None
    _value(loss, z, y)
    dz = user_call("backward", loss.backward)
    first = dev.host(dz)
    problem = aux.grad_problem(dz, z, "z")
    log.record("grad-structure", problem is None, problem or "", where)
    _value(loss, z, y)  # training calls backward once per forward: a loss may change its caches
    again = user_call("backward", loss.backward)
    gap = aux.max_gap({"z": first}, {"z": dev.host(again)})
    log.record("reentrant", gap is None or gap[1] <= settings.nondet_tol * aux.magnitude(first),
               "" if gap is None else f"z's gradient differs between two forward/backward passes at the same point "
                                      f"(max diff {gap[1]:.3g})", where)
    moved = aux.changed({"z": z0, "y": y0}, {"z": dev.host(z), "y": dev.host(y)})
    log.record("inputs-unchanged", not moved, f"{', '.join(moved)} modified in place by forward/backward", where)
    mode = settings.mode_for(z.size, jacobian=False)
    if problem is not None:
        return TensorRun("z", "input", tuple(z.shape), str(z.dtype), mode, failed=True, notes=[problem])
    if moved:  # each forward would evaluate at another point: differences would not be of one function
        return TensorRun("z", "input", tuple(z.shape), str(z.dtype), mode, failed=True,
                         notes=[f"not compared: forward/backward modify {' and '.join(moved)} in place (the check "
                                f"stops there, as for a layer)"])
    value = lambda: _value(loss, z, y)  # noqa: E731
    if loss64 is None:
        side = twin.ScalarSide(value, {"z": z}, settings.dtype)
    else:  # float32: differences of a float64 copy of the loss (gradcheck.twin)
        z64 = dev.put(z0.astype(np.float64))
        y64 = dev.put(y0.astype(np.float64) if y0.dtype.kind == "f" else y0.copy())
        side = twin.scalar_side(value, lambda: _value(loss64, z64, y64), {"z": z}, {"z": z64}, LossRaised,
                                settings.float32_eps)
        if side.dtype == "float32" and dodge.recheck(distance, final):  # float32's wider step: wider margin
            return None
    run = check_tensor(side.probe(settings), side.arrays["z"], first, "z", "input", mode, settings, rng, where,
                       dtype=str(z.dtype))
    run.notes += side.notes
    return run
