"""`dlrun gradcheck CONFIG.yaml`: the whole model plus its loss, then each layer as the model uses it.

The whole-model check of the Oxford machine-learning practical 5 (Torch): on a small batch of the config's own data,
in float64, the loss is differentiated numerically with respect to every trainable parameter
and compared with backpropagation through the model. The run-wide regularizer is left out
(a penalty can hide a data-loss bug; cs231n). Then every layer is checked on the per-sample
shape it sees in that model, with the config's options, and the loss on its own.
"""
from __future__ import annotations

import time

import numpy as np

from .. import registry
from ..backend import to_host
from ..config import load_config
from ..data import load_data
from ..errors import DlrunError
from ..runs.assembly import build_model
from ..model import Sequential
from ..training.preflight import balance_class_weights
from . import device as devices, inputs, kinks, twin
from .harness import restore_state, snapshot_state
from .losscheck import check_loss
from .regcheck import check_regularizer
from .numeric import check_tensor
from .report import LayerReport, TensorResult, merge, new_report
from .runner import check_layer
from .settings import Settings


def small_batch(y: np.ndarray, size: int, rng) -> np.ndarray:
    """Random row indices, with one row of each class first (for integer labels)."""
    n = len(y)
    if n <= size:
        return np.arange(n)
    order = rng.permutation(n)
    first = []
    if y.dtype.kind in "iu" and y.ndim == 1:
        first = order[np.unique(y[order], return_index=True)[1]][:size].tolist()
    taken = set(first)
    rest = [int(i) for i in order if int(i) not in taken]
    return np.sort(np.asarray(first + rest[: size - len(first)], dtype=np.int64))


class ModelProbe:
    """L(θ) = loss(model(x), y) with layer state frozen and randomness reseeded per forward."""

    def __init__(self, model: Sequential, loss, x, y, seed: int):
        self.model, self.loss, self.x, self.y, self.seed = model, loss, x, y, seed
        self.frozen = [snapshot_state(layer) for layer in model.layers]

    def value(self) -> float:
        for i, (layer, frozen) in enumerate(zip(self.model.layers, self.frozen)):
            restore_state(layer, frozen)
            if layer.stochastic:
                layer.rng = self.model.backend.rng(self.seed + i)
        out = self.model.forward(self.x, self.y)
        return float(self.loss.forward(out, self.y))

    def signature(self):
        return tuple(kinks.freeze(layer.branch_signature()) for layer in self.model.layers)


def check_config(path, overrides=(), settings: Settings | None = None, batch: int = 8) -> LayerReport:
    """Check the model and loss of a config, then each of its layers; return the report."""
    settings = (settings or Settings()).resolved()
    cfg = load_config(path, overrides)
    report = new_report(str(path), settings, ("dtype", "eps", "atol", "rtol", "seed", "mode"))
    if cfg.regularizer is not None:
        report.warnings.append("the run-wide regularizer is left out of the model check (the data loss alone); "
                               "it is checked on its own below")
    t0 = time.perf_counter()
    rng = np.random.default_rng(settings.seed)
    dev = devices.open_device(settings.device)  # --device, not the config's device key
    ds = load_data(cfg, holdout=False)  # the inputs the model takes (data.preprocess applied)
    model = build_model(cfg, ds.input_shape, dev.backend, settings.np_dtype, settings.seed, frozen=False)
    loss = cfg.build("loss")
    balance_class_weights(loss, model, ds.y, cfg)  # class_weights: balanced, from the data's labels
    twin_of = None
    if settings.dtype == "float32":  # differences of a float64 copy of model and loss (gradcheck.twin)
        twin_of = (build_model(cfg, ds.input_shape, dev.backend, np.float64, settings.seed, frozen=False),
                   cfg.build("loss"))
    for attempt in range(settings.resample + 1):  # a batch whose differences cross many kinks is redrawn
        idx = small_batch(ds.y, batch, rng)
        if attempt == 1:  # the kinks may come from the parameters: zero biases on zero pixels sit on ReLU's
            _jitter(model, rng)
            report.warnings.append(f"over 1% of the elements crossed a kink at the initial parameters; the model "
                                   f"is checked at them plus N(0, {JITTER:g}²) noise on every trainable parameter")
        results = _check_model(report, model, loss, ds, idx, settings, rng, twin_of)
        if results is None or not kinks.too_many_skipped(sum(t.skipped for t in results.values()),
                                                          sum(t.checked for t in results.values())):
            break
    if results is not None:  # the model raised: the checks below still say which piece is broken
        report.tensors = list(results.values())
    owners = {i for i, _ in model.owners()}  # (a node sharing another's weights is that layer again)
    for i, layer in enumerate(model.layers):
        if i not in owners:
            continue
        spec = dict(getattr(layer, "spec", {}) or {})
        name = spec.pop("type", type(layer).__name__)
        shapes = model.input_shapes(i)
        shape = shapes[0] if layer.num_inputs == 1 else inputs.joined_shape(shapes)
        child = check_layer(name, spec, settings, input_shape=shape, batch=len(idx))
        child.layer = f"{model.label(i)} {name}"
        report.children.append(child)
    name, options = registry.losses.parse_spec(cfg.loss)
    child = check_loss(name, options, settings)  # on its own, so a loss bug is named as one
    child.layer = f"loss {name}"
    report.children.append(child)
    if cfg.regularizer is not None:  # its gradient against its penalty, as `dlrun gradcheck L2` does
        name, options = registry.regularizers.parse_spec(cfg.regularizer)
        child = check_regularizer(name, options, settings)
        child.layer = f"regularizer {name}"
        report.children.append(child)
    report.seconds = time.perf_counter() - t0
    return report


JITTER = 0.01  # far from the kinks (|Δ| ≫ eps) yet a small move for weights drawn at fan-in scale


def _jitter(model: Sequential, rng) -> None:
    """Move every trainable parameter by N(0, JITTER²): backpropagation is as correct at that
    point, and pre-activations no longer sit exactly on a kink because a bias is exactly 0."""
    for _, p in model.named_parameters():
        if p.trainable:
            p.data += model.backend.asarray(rng.normal(0.0, JITTER, p.data.shape).astype(p.data.dtype))


def _check_model(report, model, loss, ds, idx, settings, rng, twin_of=None) -> dict | None:
    """Every trainable parameter of the model at one batch; None when the model raised.
    ``twin_of``: (float64 model, loss) differenced in place of the float32 ones when they agree."""
    backend = model.backend
    x = backend.asarray(np.ascontiguousarray(ds.x[idx], dtype=settings.np_dtype))
    y = backend.asarray(ds.y[idx].astype(np.int64 if getattr(loss, "task", "") == "classification"
                                         else settings.np_dtype))
    model.train()
    mp = ModelProbe(model, loss, x, y, settings.seed)
    try:
        first, again = mp.value(), mp.value()
        if not abs(first - again) <= 1e-12 * max(1.0, abs(first)):  # (NaN too): no one function to difference
            report.error = (f"the model's loss differs between two evaluations at the same point ({first:.6g}, then "
                            f"{again:.6g}): a layer draws outside its seeded generator, keeps state between calls "
                            f"or changes its input in place; the layer checks name which")
            return None
        sig0 = mp.signature()
        dz = loss.backward()
        got, expected = tuple(getattr(dz, "shape", ())), (len(x), *model.shapes[-1])
        if got != expected:  # caught here, not as a matmul error deep inside the model
            report.error = f"the loss's backward returned shape {got}, expected the model output's {expected} " \
                           f"(see the loss's own check)"
            return None
        model.backward(dz)
    except Exception as e:
        # a layer's error names itself (model[2] X: backward raised ...); anything else its type
        report.error = str(e) if isinstance(e, DlrunError) else f"model forward/backward raised {type(e).__name__}: {e}"
        return None
    params = [(n, p) for n, p in model.named_parameters() if p.trainable]
    grads = {n: np.array(to_host(p.grad), dtype=np.float64) for n, p in params}
    mode = settings.mode_for(sum(p.size for _, p in params), jacobian=False)  # (the output: the scalar loss)
    signed = any(kinks.has_signature(la) for la in model.layers)
    side = None if twin_of is None else _float64_side(model, mp, *twin_of, signed, report, settings.float32_eps)
    if side is None:
        side = twin.ScalarSide(mp.value, {n: p.data for n, p in params}, settings.dtype,
                               signature=mp.signature if signed else None, sig0=sig0)
    probe = side.probe(settings)
    results: dict[str, TensorResult] = {}
    where = f"whole model, batch of {len(idx)}"
    for n, p in params:
        run_mode = mode if mode != "fast+sampled" or p.size > settings.samples else "exhaustive"
        merge(results, check_tensor(probe, side.arrays[n], grads[n], n, "param", run_mode, settings, rng, where,
                                    dtype=str(p.data.dtype)))
    return results


def _float64_side(model, mp: ModelProbe, model64, loss64, signed: bool, report,
                  step: float) -> twin.ScalarSide | None:
    """The float64 copy holding the float32 model's parameters and frozen state, at the same
    batch; None (and a warning naming float32's ``step``) when its loss disagrees."""
    for (_, p), (_, q) in zip(model.named_parameters(), model64.named_parameters()):
        q.data[...] = p.data
    backend = model.backend
    x = backend.asarray(np.asarray(to_host(mp.x), dtype=np.float64))
    y = mp.y.astype(np.float64) if mp.y.dtype.kind == "f" else mp.y
    model64.train()
    tp = ModelProbe(model64, loss64, x, y, mp.seed)
    tp.frozen = [{k: twin.as64(v) for k, v in f.items()} for f in mp.frozen]
    try:
        why = twin.disagreement([tp.value()], [mp.value()])
        sig = tp.signature()
    except Exception as e:  # the float64 copy's own code
        why = f"its float64 instance raised {type(e).__name__}: {e}"
    if why is not None:
        twin.warn_fallback(report.warnings, "the model", why, step)
        return None
    return twin.ScalarSide(tp.value, {n: q.data for n, q in model64.named_parameters()}, "float64",
                           signature=tp.signature if signed else None, sig0=sig)
