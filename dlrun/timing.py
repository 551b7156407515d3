"""`dlrun time`: where a training step spends its time, layer by layer (like ``caffe time``).

Runs real training steps (the trainer's fast path: reused buffers, no input gradient for the
first trainable layer) on a config's model and data, timing each layer's forward and backward,
the loss and the optimizer step separately, with device synchronisation after each part on GPU.
Times are medians over the timed batches, after untimed warm-up batches.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from . import contract, run
from .config import Config
from .errors import UsageError


@dataclass(frozen=True)
class PartTiming:
    """Median seconds of one part of a step; ``backward`` is None where backward is skipped."""

    name: str
    output_shape: tuple | None
    forward: float | None
    backward: float | None

    @property
    def total(self) -> float:
        return (self.forward or 0.0) + (self.backward or 0.0)


@dataclass(frozen=True)
class TimingReport:
    layers: list[PartTiming]
    loss: PartTiming
    optimizer: float
    step: float       # median wall time of a whole step (including the timing's own overhead)
    batches: int
    batch_size: int
    device: str
    order: tuple[int, ...] = ()   # the model's execution order (Sequential.order): the rows' order
    finite: bool = True           # False when the loss became NaN or inf during the timed steps
    metrics: PartTiming | None = None  # train.metrics' sums, when the config has any

    @property
    def parts_total(self) -> float:
        return (sum(p.total for p in self.layers) + self.loss.total + self.optimizer
                + (self.metrics.total if self.metrics else 0.0))


def time_config(config: Config, batches: int = 20, warmup: int = 2) -> TimingReport:
    """Time ``batches`` training steps of the config's model (after ``warmup`` untimed ones)."""
    if batches < 1 or warmup < 0:
        raise UsageError(f"--batches must be at least 1, got {batches}")
    ds, trainer = run.prepare(config)
    model, loss, opt, backend = trainer.model, trainer.loss, trainer.optimizer, trainer.backend
    x, y = trainer._to_device(ds.x, ds.y)
    n = len(x)
    bs = n if trainer.batch_size is None else min(trainer.batch_size, n)
    layers = [model.layers[i] for i in model.order]  # execution order (see Sequential.order)
    fwd = [[] for _ in layers]
    bwd = [[] for _ in layers]
    loss_f, loss_b, opt_t, step_t, metric_t = [], [], [], [], []
    sums = trainer.tracker.zeros()  # None without train.metrics
    sync = backend.synchronize
    clock = time.perf_counter
    trainer._fast_mode(True)
    # one untimed step first, training's checked first step: a layer, loss, regularizer or
    # optimizer that breaks its contract or raises is named as training names it
    with np.errstate(all="ignore"):
        contract.first_step(trainer, x[:bs], y[:bs], ())
    starts = [(b * bs) % max(n - bs + 1, 1) for b in range(warmup + batches)]
    finite = True  # every loss so far finite: a device flag, read once after the timing (a loss may
    # return a 0-d buffer it reuses, so the values themselves cannot be kept)
    saved = np.seterr(all="ignore")  # a diverging config is still timed; the report says it diverged
    try:
        for b, s in enumerate(starts):
            keep = b >= warmup
            xb, yb = x[s:s + bs], y[s:s + bs]
            sync()
            t_step = clock()
            h = xb
            for i, layer in enumerate(layers):
                t0 = clock()
                h = layer.forward(h, yb) if layer.needs_labels else layer.forward(h)
                sync()
                keep and fwd[i].append(clock() - t0)
            t0 = clock()
            value = loss.forward(h, yb)
            sync()
            keep and loss_f.append(clock() - t0)
            finite = backend.xp.logical_and(finite, backend.xp.isfinite(value))  # (outside the timed part)
            if sums is not None:  # as training adds them, right after the loss's forward
                t0 = clock()
                trainer.tracker.add(sums, h, yb, loss)
                sync()
                keep and metric_t.append(clock() - t0)
            t0 = clock()
            dy = loss.backward()
            sync()
            keep and loss_b.append(clock() - t0)
            for i in range(len(layers) - 1, model._stop - 1, -1):
                t0 = clock()
                dy = layers[i].backward(dy)
                sync()
                keep and bwd[i].append(clock() - t0)
            t0 = clock()
            for p, reg in trainer._regularized:
                reg.add_gradient(p.data, p.grad)
            opt.step()
            sync()
            if keep:
                opt_t.append(clock() - t0)
                step_t.append(clock() - t_step)
    finally:
        trainer._fast_mode(False)
        np.seterr(**saved)
    med = statistics.median
    rows = [PartTiming(f"{model.order[k]} {type(layer).__name__}", shape, med(fwd[k]), med(bwd[k]) if bwd[k] else None)
            for k, (layer, shape) in enumerate(zip(layers, model.order_shapes))]
    finite = bool(finite)
    metrics = (PartTiming(f"metrics {', '.join(trainer.tracker.names)}", None, med(metric_t), None)
               if metric_t else None)
    return TimingReport(rows, PartTiming(f"loss {type(loss).__name__}", None, med(loss_f), med(loss_b)), med(opt_t),
                        med(step_t), batches, bs, backend.name, model.order, finite, metrics)
