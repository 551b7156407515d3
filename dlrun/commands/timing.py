"""`dlrun time`: where a training step spends its time, layer by layer (like ``caffe time``).

Runs real training steps (the trainer's fast path: reused buffers, no input gradient for the
first trainable layer) on a config's model and data, timing each layer's forward and backward,
the loss and the optimizer step separately, with device synchronisation after each part on GPU.
Times are medians over the timed batches, after untimed warm-up batches. On GPU the report adds
the mean time of a whole step as training runs it, the ordinary way and replayed as a CUDA graph
(:mod:`dlrun.training.capture`), and whether the step was captured.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..runs.assembly import assemble
from ..config import Config
from ..errors import UsageError
from ..training import capture
from ..training.step import StepObserver


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
    cuda_graph: str | None = None  # GPU: "captured" or "not captured: why" (train.cuda_graph)
    # GPU: mean seconds of a whole unobserved step, the ordinary way and as a CUDA graph's replay
    # (None where it is not captured)
    plain_step: float | None = None
    graph_step: float | None = None

    @property
    def parts_total(self) -> float:
        return (sum(p.total for p in self.layers) + self.loss.total + self.optimizer
                + (self.metrics.total if self.metrics else 0.0))


class PartClock(StepObserver):
    """Times each part of an observed training step: the time since the previous hook, with the
    device synchronised before each reading, so each part gets its own kernels' time."""

    def __init__(self, layers: int, backend):
        self.sync, self.clock = backend.synchronize, time.perf_counter
        self.xp = backend.xp
        self.keep = False  # False during warm-up steps
        self.fwd = [[] for _ in range(layers)]
        self.bwd = [[] for _ in range(layers)]
        self.loss_f, self.loss_b, self.opt, self.steps, self.metric = [], [], [], [], []
        self.finite = True  # every loss so far finite: a device flag, read once after the timing (a loss
        # may return a 0-d buffer it reuses, so the values themselves cannot be kept)

    def _lap(self, into: list | None) -> None:
        self.sync()
        now = self.clock()
        if self.keep and into is not None:
            into.append(now - self.last)
        self.last = now

    def begin(self, xb, yb):
        self.sync()
        self.last = self.start = self.clock()

    def forward(self, k, layer, out):
        self._lap(self.fwd[k])

    def loss(self, value, out, y):
        self._lap(self.loss_f)
        self.finite = self.xp.logical_and(self.finite, self.xp.isfinite(value))  # (outside the timed parts)
        self.last = self.clock()

    def metrics(self):
        self._lap(self.metric)

    def loss_backward(self, dy, out):
        self._lap(self.loss_b)

    def backward(self, k, layer, dx):
        self._lap(self.bwd[k])

    def updated(self, optimizer):  # the regularizers' gradients and the optimizer's step
        self._lap(self.opt)
        if self.keep:
            self.steps.append(self.last - self.start)


def time_config(config: Config, batches: int = 20, warmup: int = 2) -> TimingReport:
    """Time ``batches`` training steps of the config's model (after ``warmup`` untimed ones)."""
    if batches < 1 or warmup < 0:
        raise UsageError(f"--batches must be at least 1, got {batches}")
    run = assemble(config)
    ds, trainer = run.data, run.trainer
    model, loss, backend = trainer.model, trainer.loss, trainer.backend
    x, y = trainer.to_device(ds.x, ds.y)
    n = len(x)
    bs = n if trainer.batch_size is None else min(trainer.batch_size, n)
    sums = trainer.tracker.zeros()  # None without train.metrics
    step = trainer.training_step
    clock = PartClock(len(model.order), backend)
    trainer.fast_mode(True)
    # one untimed step first, training's checked first step: a layer, loss, regularizer or
    # optimizer that breaks its contract or raises is named as training names it
    with np.errstate(all="ignore"):
        step(x[:bs], y[:bs])
    starts = [(b * bs) % max(n - bs + 1, 1) for b in range(warmup + batches)]
    saved = np.seterr(all="ignore")  # a diverging config is still timed; the report says it diverged
    try:
        for b, s in enumerate(starts):
            clock.keep = b >= warmup
            step.observed(x[s:s + bs], y[s:s + bs], sums=sums, observers=[clock])
        graph = plain = None
        if backend.name == "gpu":
            plain = _whole_steps(step, x, y, starts, bs, sums, backend, graph=False)
            graph = _whole_steps(step, x, y, starts, bs, sums, backend, graph=True) if step.graph is not None else None
    finally:
        trainer.fast_mode(False)
        np.seterr(**saved)
    med = statistics.median
    layers = model.run_order
    nodes = [f" {r.node}" if r.inputs else "" for r in model.summary()]  # a graph's node: its name or place
    rows = [PartTiming(f"{model.order[k]}{nodes[model.order[k]]} {type(layer).__name__}", shape, med(clock.fwd[k]),
                       med(clock.bwd[k]) if clock.bwd[k] else None)
            for k, (layer, shape) in enumerate(zip(layers, model.order_shapes))]
    metrics = (PartTiming(f"metrics {', '.join(trainer.tracker.names)}", None, med(clock.metric), None)
               if clock.metric else None)
    status = capture.status(step) if backend.name == "gpu" else None
    return TimingReport(rows, PartTiming(f"loss {type(loss).__name__}", None, med(clock.loss_f), med(clock.loss_b)),
                        med(clock.opt), med(clock.steps), batches, bs, backend.name, model.order, bool(clock.finite),
                        metrics, status, plain, graph if status == "captured" else None)


def _whole_steps(step, x, y, starts, bs, sums, backend, graph: bool) -> float:
    """Mean seconds of a whole training step run as training runs it (no observer), with or
    without its CUDA graph: the steps are queued back to back and the device synchronised once."""
    kept = step.graph
    if not graph:
        step.graph = None
    try:
        for s in starts[:capture.WARMUP + 1]:  # (with the graph: the warm-up steps and the capture)
            step(x[s:s + bs], y[s:s + bs], sums=sums)
        backend.synchronize()
        t0 = time.perf_counter()
        for s in starts:
            step(x[s:s + bs], y[s:s + bs], sums=sums)
        backend.synchronize()
        return (time.perf_counter() - t0) / len(starts)
    finally:
        step.graph = kept
