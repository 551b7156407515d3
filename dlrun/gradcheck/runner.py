"""Check one registered layer: shape configurations × phases × points, aggregated into a report."""
from __future__ import annotations

import time

import numpy as np

from .. import registry
from . import auxiliary as aux, device as devices, inputs, kinks, paths, twin
from .harness import (ContractError, Harness, LayerRaised, build, loose_arrays, public_arrays, public_scalars,
                      restore_state, state_changes)
from .compare import explain_rounding
from .dtypes import float32_problem
from .jacobian import TooLarge, check_jacobians
from .numeric import TensorRun, check_tensor
from .report import FAIL, LayerReport, TensorResult, merge, new_report
from .settings import Settings

def run_point(h: Harness, spec, point, out_shape, settings: Settings, rng, where: str, log: aux.AuxLog):
    """Forward/backward at one point, the aux checks, then the numeric check of each tensor.

    ``point`` is on the host; the layer reads (and the numeric check perturbs) device copies."""
    layer, dev = h.layer, h.device
    x, y = dev.put(point.x), dev.put(point.y)
    _host = dev.host
    differentiable = spec.kind in inputs.FLOAT_KINDS
    start = public_scalars(layer)
    # pristine copies, taken before any forward can write into x or a parameter
    x0, y0 = np.array(point.x, copy=True), None if point.y is None else np.array(point.y, copy=True)
    params0 = {n: _host(p.data) for n, p in layer.params.items() if n not in layer.state}
    out = h.forward(x, y)  # warm-up: replaces caches and attributes left by the previous shape
    expected = (x.shape[0], *out_shape)
    if not (hasattr(out, "shape") and hasattr(out, "dtype")):
        raise ContractError(f"forward returned {type(out).__name__}, expected an array of shape {expected} ({where})")
    log.record("output-shape", tuple(out.shape) == expected and out.dtype == settings.np_dtype,
               f"forward returned shape {tuple(out.shape)} {out.dtype}, expected {expected} {np.dtype(settings.np_dtype)} "
               f"(the shape build declared, the dtype of the check){aux.by_design(out.dtype, settings.np_dtype)}",
               where)
    bad_out = ~np.isfinite(_host(out)) if out.dtype.kind in "fc" else np.zeros(0, bool)
    log.record("output-finite", not bad_out.any(),
               f"forward's output holds {int(bad_out.sum())} NaN or inf values at finite inputs, first at out"
               f"{list(np.argwhere(bad_out)[0]) if bad_out.any() else ''}", where)
    g = rng.standard_normal(out.shape).astype(out.dtype)
    fresh = _host(out)  # a backward may change its own output in place (o *= 1 - o): training reads it before
    h.backward(g.copy())  # (the harness moves it to the device)
    kept = _host(out)  # the rows reversed are other inputs of the same kind (labels follow them)
    arrays = public_arrays(layer)  # after one step at this point: a cache of it is the same after the next
    h.forward(dev.put(point.x[::-1].copy()), None if point.y is None else dev.put(point.y[::-1].copy()))
    log.record("output-aliasing", np.array_equal(_host(out), kept, equal_nan=True),
               "a second forward overwrote the first one's output: the layer returns a buffer it reuses "
               "across calls", where)

    before = public_scalars(layer)
    out0 = _host(h.forward(x, y))
    # an undeclared coefficient that moved explains a difference: the state check names it
    if (not aux.repeatable(fresh, out0, settings.nondet_tol)
            and not aux.scalar_changes(start, public_scalars(layer), settings.dtype)):
        moved = _modified(h, x0, y0, params0, x, y, _host)
        if moved:  # a bug found (FAIL), and the check cannot go on from a point that moved
            log.record("inputs-unchanged", False, f"{', '.join(moved)} modified in place by forward/backward", where)
            raise ContractError(f"two forwards at the same point give different outputs because forward/backward "
                                f"modified {', '.join(moved)} in place ({where})")
        raise ContractError(f"two forwards at the same point give different outputs ({where}): the layer is "
                            f"stochastic without the seed hook, or keeps private state between calls. A layer that "
                            f"draws random numbers sets `stochastic = True` and draws them from self.rng, which "
                            f"gradcheck reseeds before every forward; a counter or running value that changes the "
                            f"output belongs in `state`, which gradcheck freezes")
    sig0 = h.signature()
    dy = dev.put(g.copy())  # the array backward receives, checked afterwards for in-place writes
    dx = h.backward(dy)
    trainable = {n: p for n, p in layer.params.items() if p.trainable}
    grads = {n: _host(p.grad) for n, p in trainable.items()}
    first = dict(grads, x=_host(dx) if differentiable else None)
    declared = state_changes(layer, h.frozen)
    hidden = aux.scalar_changes(before, public_scalars(layer), settings.dtype)
    hidden += [f"{k} (an array of shape {arrays[k].shape}: running statistics?) changed"
               for k in aux.changed(arrays, public_arrays(layer))]
    problems = {n: aux.grad_problem(p.grad, p.data, n) for n, p in trainable.items()}  # (before the one-row
    left = aux.unwritten_by(h, trainable, x, y, g, grads)  # backward: a rebound grad has that one's shape)
    if differentiable:
        problems["x"] = aux.grad_problem(dx, x, "x") or aux.float32_values(first["x"], "x")
    for n in trainable:
        problems[n] = problems[n] or left.get(n) or aux.float32_values(grads[n], n)
    bad = {k: v for k, v in problems.items() if v}
    log.record("grad-structure", not bad, "; ".join(bad.values()), where)

    h.forward(x, y)  # training calls backward once per forward: a layer may free or change its caches
    again = h.backward(g.copy())
    second = {n: _host(p.grad) for n, p in trainable.items()}
    second["x"] = _host(again) if differentiable else None
    # a gradient grad-structure already failed (+= into it, a wrong shape) fails the checks below
    # too, each with its own misleading hint: they judge the others
    sound = lambda grads: {k: v for k, v in grads.items() if k not in bad}  # noqa: E731
    gap = aux.max_gap(sound(first), sound(second))
    log.record("reentrant", gap is None or gap[1] <= settings.nondet_tol * aux.magnitude(first[gap[0]]),
               "" if gap is None else f"{gap[0]} differs between two forward/backward passes at the same point (max diff "
                       f"{gap[1]:.3g}): a buffer accumulated, or undeclared state changed", where)
    h.forward(x, y)
    zx = h.backward(np.zeros_like(g))
    zeros = {n: _host(p.grad) for n, p in trainable.items()}
    zeros["x"] = _host(zx) if differentiable else None
    nz = aux.nonzero(sound(zeros))
    log.record("zero-upstream", not nz,
               f"backward(0) gives a non-zero or non-finite gradient for {', '.join(nz)} (not multiplied by the "
               f"upstream gradient?)",
               where)
    moved = _modified(h, x0, y0, params0, x, y, _host) + aux.changed({"upstream gradient": g},
                                                                       {"upstream gradient": _host(dy)})
    log.record("inputs-unchanged", not moved, f"{', '.join(moved)} modified in place by forward/backward", where)
    note = f"declared state {', '.join(declared)} changes in a step; frozen and restored during the check" if declared else ""
    log.record("state", not hidden, f"{'; '.join(hidden)} in one forward/backward but is not declared in `state`",
               where, note)
    if h.signed:  # the branch choices at the point now, after the calls above: the differences' reference
        h.forward(x, y)
        now = h.signature()
        if not kinks.same(now, sig0):
            log.record("state", False, "branch_signature() differs between two forwards at the same point: forward "
                       "keeps its branch choices (a mask, an argmax) from an earlier call instead of taking them from "
                       "this input: a stale cache, which backward reads too (compute the mask in every forward)",
                       where)
        sig0 = now

    g64 = g.astype(np.float64)
    side = twin.own_side(h, x, y, trainable, sig0, out0, settings.dtype)
    if settings.dtype == "float32":  # differentiate a float64 copy: float32 rounding blurs differences
        other = twin.float64_side(h, point, out0, trainable)
        if isinstance(other, str):
            h.twin_note = other
        else:
            side = other
    h.fell_back = side.dtype == "float32"
    probe = side.probe(g64, settings)
    tensors = ([("x", "input", x, first["x"])] if differentiable else [])
    tensors += [(n, "param", p.data, grads[n]) for n, p in trainable.items()]
    mode = settings.mode_for(sum(t[2].size for t in tensors))
    jac = {}
    if mode == "jacobian":
        checked = [(n, r, a) for n, r, a, _ in tensors if not bad.get(n)]
        jac = {r.name: r for r in check_jacobians(h, x, y, side, checked, settings, where)}
    runs = []
    for name, role, arr, grad in tensors:
        run_mode = mode if mode != "fast+sampled" or arr.size > settings.samples else "exhaustive"
        if bad.get(name):
            runs.append(TensorRun(name, role, tuple(arr.shape), str(arr.dtype), run_mode, failed=True,
                                  notes=[bad[name]]))
            continue
        if name in jac:
            runs.append(jac[name])
            continue
        extra = _class_rows(point.x, point.y, rng) if name == "x" and y is not None else ()
        runs.append(check_tensor(probe, side.arrays[name], grad, name, role, run_mode, settings, rng, where, extra,
                                 dtype=str(arr.dtype)))
    if side.dtype == "float32":
        explain_rounding(runs, g64, out0, probe.h)
    in_float32 = aux.float32_note(out0, settings.dtype)
    for r in runs:  # (those grad-structure failed carry its note: compared, they would have failed here)
        if r.failed and r.checked and in_float32 and in_float32 not in r.notes:
            r.notes.append(in_float32)

    unwired = paths.unwired(h, trainable, grads, x, y, out0, rng)
    log.record("wiring", not unwired, f"perturbing {', '.join(unwired)} does not change the output "
               f"(parameter not used, or the layer reads a copy)", where)
    for check, problem in (("fast-mode", paths.fast_mode_problem), ("non-contiguous", paths.layout_problem)):
        found = problem(h, x, y, g, settings.dtype, skip=set(bad))
        log.record(check, found is None, found or "", where)
    restore_state(layer, h.frozen)
    return runs


def _modified(h: Harness, x0, y0, params0: dict, x, y, host) -> list[str]:
    """What forward/backward wrote into: the inputs, or a parameter outside the optimizer."""
    names = aux.changed({"x": x0, "y": y0}, {"x": host(x), "y": host(y)})
    params = aux.changed(params0, {n: host(h.layer.params[n].data) for n in params0})
    return names + [f"parameter {n}" + (f" (reassigned: {n}.data = ...)" if n in h.rebound else "")
                    for n in params]


def _class_rows(x, y, rng):
    """Sampled mode: one element from a row of each class, so every class's branch is seen."""
    row = int(np.prod(x.shape[1:]))
    firsts = np.unique(y, return_index=True)[1]
    return [int(i) * row + int(rng.integers(row)) for i in firsts]


def check_layer(name: str, options: dict | None = None, settings: Settings | None = None,
                input_shape: tuple | None = None, batch: int = 7) -> LayerReport:
    """Gradient-check the registered layer ``name``; return a report (never prints).

    Without ``input_shape`` the layer is checked on two shape configurations from its
    ``input_spec``; with it (a whole-model check), on that per-sample shape with ``batch`` rows.
    The layer runs on ``settings.device``. Raises ConfigError for an unknown name or a bad
    option, BackendError for an unusable device; a layer that raises is reported.
    """
    settings = (settings or Settings()).resolved()
    dev = devices.open_device(settings.device)
    cls = registry.layers.get(name)
    spec = cls.input_spec
    report = new_report(name, settings)
    phases = settings.phases(cls.has_phase)
    report.settings["phase"] = "+".join(phases)
    if settings.dims is not None and input_shape is None:
        report.settings["dims"] = ",".join(f"{k}={v}" for k, v in settings.dim_configs()[0].items())
    configs = settings.dim_configs() if input_shape is None else [None]
    results: dict[str, TensorResult] = {}
    log = aux.AuxLog()
    rng = np.random.default_rng(settings.seed)
    dodge = settings.dodge()
    t0 = time.perf_counter()
    few: list = []  # per configuration: a note when its labels barely repeat
    for dims in configs:
        given = inputs.layer_options(spec, dims, options or {})
        layer = inputs.build_layer(name, given, name)
        n = dims["N"] if dims else batch
        where_dims = inputs.dims_label(spec, dims, input_shape)
        built = inputs.built_with(name, given)
        if built not in report.built:
            report.built.append(built)
        try:
            shape = inputs.shape_of(input_shape) if dims is None else inputs.per_sample_shape(spec, dims)
            layer.setup(dev.backend, settings.np_dtype, np.random.default_rng(settings.seed), settings.seed)
            out_shape = build(layer, shape, where_dims)
            note = loose_arrays(name, layer)
            if note and note.split(":")[0] not in "".join(report.warnings):  # once, from the first shape
                report.warnings.append(note)
            few.append(inputs.repeat_note(layer, spec, dims, out_shape, n))
            h = Harness(layer, settings.seed, dev)
            h.fresh = lambda dtype=settings.np_dtype, d=dims, s=shape: inputs.fresh_layer(
                name, spec, d, options or {}, s, dev, dtype, settings.seed)
            try:
                _check_phases(h, spec, dims, shape, out_shape, n, phases, where_dims, settings, rng, results, log,
                              dodge)
            finally:
                twin.warn_fallback(report.warnings, name, h.twin_note, settings.float32_eps)
            if settings.phase == "auto" and phases == ("train",) and paths.reads_phase(h, inputs.draw_point(
                    spec, dims, shape, out_shape, n, layer, settings, np.random.default_rng(settings.seed + 1))):
                report.settings["phase"] = "train+eval"  # checked in evaluation too, from this shape on
                if not any("has_phase" in w for w in report.warnings):
                    report.warnings.append(f"{name}'s output differs between training and evaluation, but it does "
                                           f"not set has_phase = True: evaluation is checked too; declare it")
                _check_phases(h, spec, dims, shape, out_shape, n, ("eval",), where_dims, settings, rng, results, log,
                              dodge)
        except (LayerRaised, ContractError, TooLarge) as e:
            report.error = str(e)
            if isinstance(e, LayerRaised) and e.call == "backward":  # p.grad[...] = x.T @ dy: a wrong gradient
                _misfit(e, layer, spec, n, shape, results, log)
            break
    if few and all(few):  # no configuration repeats labels enough (the defaults have one that does)
        report.warnings.append(few[0])
    if settings.dtype == "float64" and report.error is None:  # training runs in float32
        dims = configs[0]
        shape = inputs.shape_of(input_shape) if dims is None else inputs.per_sample_shape(spec, dims)
        problem = float32_problem(name, options or {}, spec, dims, shape, dims["N"] if dims else batch, dev,
                                  settings.seed)
        log.record("float32", problem is None, problem or "")
    report.tensors = list(results.values())
    report.aux = log.listing()
    aux.attribute(report.aux, report.tensors)
    dodge.annotate(report)
    report.seconds = time.perf_counter() - t0
    return report


def _misfit(e: LayerRaised, layer, spec, n: int, shape: tuple, results: dict, log: aux.AuxLog) -> None:
    """Record a backward that raised writing an array of the wrong shape into a gradient as a
    FAIL of that gradient (grad-structure and the tensor), beside the error."""
    shapes = {k: p.data.shape for k, p in layer.params.items() if p.trainable}
    if spec.kind in inputs.FLOAT_KINDS:
        shapes = {"x": (n, *shape), **shapes}
    found = aux.misfit_gradient(e, shapes)
    if found is None:
        return
    names, detail = found
    log.record("grad-structure", False, detail, e.where)
    for k in names:
        t = results.setdefault(k, TensorResult(k, "input" if k == "x" else "param", dtype=str(layer.dtype)))
        if list(shapes[k]) not in t.shapes:
            t.shapes.append(list(shapes[k]))
        t.status = FAIL
        if detail not in t.notes:
            t.notes.append(detail)


def _check_phases(h, spec, dims, shape, out_shape, n, phases, where_dims, settings, rng, results, log, dodge):
    layer = h.layer
    for phase in phases:
        layer.training = phase == "train"
        passed_first: dict[str, bool] = {}
        for p in range(settings.points):
            where = f"{phase}, {where_dims}, point {p + 1}"
            h.where = where
            for attempt in range(settings.resample + 1):
                inputs.redraw_params(layer, rng, h.device)
                point = inputs.draw_point(spec, dims, shape, out_shape, n, layer, settings, rng)
                final, known = attempt == settings.resample, h.twin_note is not None
                distance = h.kink_distance(point.x, point.y)
                if dodge.redraw(distance, final, fallback=known):  # (known: an earlier point fell back)
                    continue
                attempt_log = aux.AuxLog()
                try:
                    runs = run_point(h, spec, point, out_shape, settings, rng, where, attempt_log)
                except ContractError:  # keep what it found before it had to stop (inputs-unchanged)
                    log.merge(attempt_log)
                    raise
                if h.fell_back and not known and dodge.recheck(distance, final):
                    continue
                if not kinks.too_many_skipped(sum(r.skipped for r in runs), sum(r.checked for r in runs)):
                    break
                dodge.crossed += not final  # (drawn again for it: counted with the kinks)
            else:
                problem = aux.skip_problem(runs, settings.resample)
                if problem and not settings.detect_kinks:  # (the detector's skips come from the chosen step)
                    attempt_log.record("kink-skips", False, problem, where)
            log.merge(attempt_log)
            for r in runs:
                merge(results, r)
                if p == 0:
                    passed_first[r.name] = not r.failed
                elif r.failed and passed_first.get(r.name) and r.mode in ("exhaustive", "jacobian"):
                    # (a sampled or directional check that fails at one point only was lucky at the other)
                    log.record("second-point", False, f"{r.name} passes at point 1 but fails at point {p + 1} on the "
                               f"same instance (a stale cache or accumulating buffer, or a bug only some inputs reach: "
                               f"repeated indices, ties)", where)
                else:
                    log.record("second-point", True)
