"""`dlrun gradcheck REGULARIZER`: ``add_gradient`` against central differences of ``penalty``.

A regularizer gives the scalar penalty R(w) and adds ∂R/∂w into an existing gradient in place.
The check draws weights w ~ N(0, 1) of shape (C, D) in the layer check's shape configurations and
a random existing gradient G; ``add_gradient(w, G)`` must leave G + ∂R/∂w, which is compared with
central differences of R element by element (all modes and tolerances of the layer check apply).
Aux checks: ``adds-gradient`` (the same call on a zero gradient gives the same increment, so the
gradient was added to, not overwritten or scaled), inputs-unchanged (w) and second-point.
Without ``--set strength=...`` a regularizer with a ``strength`` option is checked at strength 1:
at a training value such as 1e-4 every gradient would sit under atol and the check say little.
"""
from __future__ import annotations

import numpy as np

from .. import registry
from . import auxiliary as aux, device as devices, twin
from .losscheck import LossRaised, kink_distance, scalar_report, user_call
from .numeric import check_tensor
from .report import LayerReport
from .settings import Settings


def check_regularizer(name: str, options: dict | None = None, settings: Settings | None = None) -> LayerReport:
    """Gradient-check the registered regularizer ``name``; return a report (never prints)."""
    settings = (settings or Settings()).resolved()
    options = dict(options or {})
    if "strength" in {o.name for o in registry.regularizers.options(name)}:
        options.setdefault("strength", 1.0)
    reg = registry.regularizers.build({"type": name, **options}, name)
    rng = np.random.default_rng(settings.seed)
    dev = devices.open_device(settings.device)
    return scalar_report(name, settings, settings.dim_configs(), lambda d: f"w ({d['C']},{d['D']})",
                         lambda dims, where, log, dodge, final: _check_point(reg, (dims["C"], dims["D"]), settings,
                                                                             rng, where, log, dev, dodge, final),
                         {k: v for k, v in options.items() if k == "strength"})


def _check_point(reg, shape, settings: Settings, rng, where: str, log: aux.AuxLog, dev, dodge, final):
    w0 = rng.standard_normal(shape).astype(settings.np_dtype)  # host; the regularizer reads w
    w = dev.put(w0.copy())
    distance = kink_distance(reg, w)
    if dodge.redraw(distance, final):
        return None
    existing = rng.standard_normal(shape).astype(settings.np_dtype)
    grad = dev.put(existing.copy())
    user_call("add_gradient", reg.add_gradient, w, grad)
    alone = dev.put(np.zeros_like(w0))
    user_call("add_gradient", reg.add_gradient, w, alone)
    added, alone = dev.host(grad).astype(np.float64) - existing, dev.host(alone)
    scale = float(np.abs(existing).max()) + float(np.abs(alone).max())
    ok = np.allclose(added, alone, rtol=0, atol=4 * np.finfo(settings.np_dtype).eps * scale)
    log.record("adds-gradient", ok, "add_gradient(w, grad) does not add to grad: the increment on a random "
               "gradient differs from the one on zeros (overwritten or scaled?)", where)

    def penalty(at=w):
        v = user_call("penalty", reg.penalty, at)
        if np.ndim(v) != 0:
            raise LossRaised(f"penalty returned shape {np.shape(v)}, expected a scalar")
        return float(v)

    penalty()
    log.record("inputs-unchanged", np.array_equal(dev.host(w), w0), "w modified in place by penalty/add_gradient", where)

    mode = settings.mode_for(w.size, jacobian=False)
    if settings.dtype == "float32":  # differences of the penalty at float64 weights (gradcheck.twin)
        w64 = dev.put(w0.astype(np.float64))
        side = twin.scalar_side(penalty, lambda: penalty(w64), {"w": w}, {"w": w64}, LossRaised, settings.float32_eps)
        if side.dtype == "float32" and dodge.recheck(distance, final):  # float32's wider step: wider margin
            return None
    else:
        side = twin.ScalarSide(penalty, {"w": w}, "float64")
    run = check_tensor(side.probe(settings), side.arrays["w"], alone, "w", "param", mode, settings, rng, where,
                       dtype=str(w.dtype))
    run.notes += side.notes
    return run
