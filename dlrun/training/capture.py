"""The training step, and each evaluation batch, captured in a CUDA graph and replayed per batch
(``train.cuda_graph``).

On a GPU every kernel launch costs microseconds of Python and driver time, and a small network's
step is little else. A CUDA graph records the launches of one step once (CuPy's stream capture,
:meth:`dlrun.backend.Backend.capture`) and replays them with one launch, as PyTorch's
``torch.cuda.graph`` does. A replay repeats the device's work exactly as captured: the same
kernels on the same addresses with the same arguments, so everything that changes from step to
step must live in device memory the graph reads, and the host's part of a step runs outside it:

* the batch is copied into the graph's static input arrays before each replay (as
  ``static_input.copy_(batch)`` in PyTorch), and the epoch's metric sums in and out;
* the optimizer's per-step values (the scheduled learning rate, Adam's bias corrections) are
  uploaded by ``Optimizer.begin_step`` into the device array its fused kernel reads;
* random draws (Dropout) advance generator state that CuPy keeps on the device;
* the step counts (``iterations``, the step's ``count``) are Python and advance on the host.

A step is captured only where that is known to hold (:func:`blocker`): on a GPU that can
capture, in one process, without gradient accumulation, with dlrun's own layers, loss, metrics,
regularizers and an optimizer that declares ``capturable``, and with no callback but gradient
clipping acting inside the step. Batches of another shape (an epoch's last, smaller batch) and
observed steps (the first step's checks, the non-finite replay, ``dlrun time``) take the
ordinary path. The graph is captured after :data:`WARMUP` ordinary steps of its shape (kernels
compiled, scratch buffers and cuBLAS' workspace allocated), and replaced when the arrays it
updates were replaced (a restore that rebinds them).

Evaluation (each epoch's validation, ``Trainer.evaluate``) replays a graph of its own per batch
shape (:class:`EvaluationGraph`: the forward in evaluation mode, the loss and the metric sums),
captured on the same terms but for the optimizer and callbacks, which it does not run
(:func:`evaluation_blocker`).
"""
from __future__ import annotations

import weakref

from ..errors import TrainingError

WARMUP = 2  # ordinary steps of a batch shape before it is captured
_GRAPHS = weakref.WeakSet()  # every graph alive (training step or evaluation), for pool_bytes


def pool_bytes() -> int:
    """The device memory that the memory pools of the CUDA graphs alive hold (beside CuPy's
    default pool, which holds everything else)."""
    return sum(p.total_bytes() for g in list(_GRAPHS) for p in g._pools)


def _ours(obj) -> bool:
    return type(obj).__module__.startswith("dlrun.")


def _name(obj) -> str:
    return type(obj).__name__


def blocker(step, callbacks=()) -> str | None:
    """Why ``step`` (a :class:`~dlrun.training.step.TrainingStep`) with ``callbacks`` cannot be
    captured in a CUDA graph, or None when it can."""
    why = step.model.backend.graphs_unsupported()
    if why:
        return why
    if step.world is not None:
        return "a data-parallel run sums the gradients over its processes inside each step"
    if step.accumulator is not None:
        return "gradient accumulation (train.accumulate_batches) runs other work on a window's last batch"
    opt = step.optimizer
    if not vars(type(opt)).get("capturable", False) or opt.hyper is None:
        return (f"the optimizer {_name(opt)} does not declare that its update reads every per-step value from the "
                f"device (capturable)")
    why = _parts_blocker(step, [("regularizer", reg) for _, reg in step.regularized])
    if why:
        return why
    for cb in callbacks:
        acts = type(cb).on_after_backward is not _base_after_backward(cb)
        if acts and not getattr(cb, "capturable", False):
            return f"the callback {_name(cb)} acts inside the step (on_after_backward)"
    return None


def _base_after_backward(cb):
    for cls in type(cb).__mro__[::-1]:
        if "on_after_backward" in vars(cls):
            return vars(cls)["on_after_backward"]
    return None


def status(step) -> str:
    """Whether ``step`` ran as a CUDA graph: "captured", or "not captured: why"."""
    if step.graph is not None:
        return step.graph.status
    if step.model.backend.name != "gpu":
        return "not captured: the CPU runs no CUDA graphs"
    return "not captured: train.cuda_graph is false"


def _arrays_of(step) -> list:
    """Every array the step's parts hold in their attributes (and in the lists, tuples, dicts and
    scratch-buffer pools there)."""
    found = []

    def walk(v, depth):
        if hasattr(v, "shape") and hasattr(v, "dtype") and hasattr(v, "data"):
            found.append(v)
        elif depth < 3 and isinstance(v, (list, tuple)):
            for a in v:
                walk(a, depth + 1)
        elif depth < 3 and isinstance(v, dict):
            for a in v.values():
                walk(a, depth + 1)
        elif depth < 3 and hasattr(v, "_arrays"):  # a BufferPool
            walk(v._arrays, depth + 1)

    parts = [*step.model.run_order, step.loss, step.optimizer, *getattr(step.tracker, "metrics", ())]
    for part in parts:
        for v in getattr(part, "__dict__", {}).values():
            walk(v, 0)
    return found


class _Graph:
    """What a captured call needs around it: warm-up steps counted per batch shape, the capture
    and its fail-safe, the private memory pools kept, and the arrays it updates as they were bound
    when it was captured (a restore that rebinds them means capturing again)."""

    def __init__(self, step, mode="auto"):
        self.step, self.mode = step, mode
        self.graph = None  # a backend.Captured
        self.key = None  # the batch shapes and modes it was captured for
        self.inputs = None  # its static inputs
        self.bound = None  # the arrays it updates, as bound when captured
        self.why_not = None  # why it is not captured (None: not decided yet, or captured)
        self.replays = 0
        self._pools = []  # every capture's memory pool: arrays from it may outlive its graph
        self._seen: dict = {}
        self._keep = []
        _GRAPHS.add(self)

    @property
    def status(self) -> str:
        """"captured" or "not captured: why", as summary.json and ``dlrun time`` say it."""
        if self.graph is not None or self.replays:
            return "captured"
        return f"not captured: {self.why_not or f'no batch shape has run the {WARMUP} ordinary steps before its capture'}"

    def _modes(self) -> tuple:
        return tuple((layer.training, layer.buffers.enabled, layer.needs_input_grad) for layer in self.step.model.run_order)

    def _run(self, key, blocked, capture, replay):
        """``replay()`` when the graph of ``key`` is captured and current; ``capture()`` when its
        warm-up is over and ``blocked()`` (why it cannot be captured, or None) allows; else None:
        the ordinary path runs this batch."""
        if self.graph is not None:
            if self.key == key:
                if self._bound_now() == self.bound:
                    return replay()
                self.graph = None  # the arrays it writes were replaced: capture again
                self._seen.clear()
            return None
        if self.why_not is not None and self.why_not.startswith("the capture failed"):
            return None
        why = blocked()
        if why is not None:
            self.why_not = why
            return None
        self._seen[key] = seen = self._seen.get(key, 0) + 1
        if seen <= WARMUP:
            return None
        return capture()

    def _capture(self, key, xb, yb, sums, call):
        """Capture ``call(x, y, s)`` on static copies of the batch and the metric sums, then run
        it once by the graph: its result, or None when the capture failed."""
        x, y = xb.copy(), yb.copy()  # the static inputs (copies: the batch may be a view of the data)
        s = None if sums is None else sums.copy()
        if not self._record(key, lambda: call(x, y, s), (x, y, s)):
            return None
        return self._launch(sums)

    def _replay(self, xb, yb, sums):
        x, y, s = self.inputs
        x[...] = xb
        y[...] = yb
        if sums is not None:
            s[...] = sums
        self._host_part()
        return self._launch(sums)

    def _host_part(self) -> None:
        """What the host does before each replay (the optimizer's per-step values, for a step)."""

    def _launch(self, sums):
        self.graph.replay()
        if sums is not None:
            sums[...] = self.inputs[2]
        self.replays += 1
        return self.graph.result

    def _record(self, key, call, inputs) -> bool:
        """Capture ``call``; True when it is the graph now, False when the capture failed and the
        ordinary path runs from here on (``mode`` True: raises TrainingError instead)."""
        step = self.step
        before = _arrays_of(step)
        try:
            graph = step.model.backend.capture(call)
        except Exception as e:
            self.why_not = f"the capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            if self.mode is True:
                raise TrainingError(f"train.cuda_graph: true, but {self.why_not}; set train.cuda_graph: auto or "
                                    f"false to train without a CUDA graph") from e
            return False
        self._pools.append(graph.pool)
        # the arrays the step's parts held before and after the capture, which the graph may read
        # or write: kept alive with it, so that their memory is never handed to anything else
        # (Backend.capture gives the default pool's other unused blocks back to the device)
        self._keep = before + _arrays_of(step)
        self.graph, self.key, self.inputs, self.why_not = graph, key, inputs, None
        self.bound = self._bound_now()
        return True


class StepGraph(_Graph):
    """The CUDA graph of one training step and what it needs around each replay.

    Args:
        step: the :class:`~dlrun.training.step.TrainingStep`.
        mode: ``"auto"`` (capture where :func:`blocker` allows) or ``True`` (the same, but a
            capture that fails raises instead of leaving the step uncaptured).
    """

    def __init__(self, step, mode="auto"):
        super().__init__(step, mode)
        self._checked = None  # (callbacks, blocker) last decided

    def _blocked(self, callbacks) -> str | None:
        cbs = tuple(callbacks)
        if self._checked is None or self._checked[0] != cbs:
            self._checked = (cbs, blocker(self.step, cbs))
        return self._checked[1]

    def _bound_now(self) -> tuple:
        """What a replay updates in place: the parameters and gradients, the optimizer's state,
        the layers' state (running statistics) and random generators (a restore rebinds them)."""
        step = self.step
        arrays = [a for _, p in step.model.named_parameters() for a in (p.data, p.grad)]
        arrays += step.optimizer.buffers()
        for layer in step.model.layers:
            arrays += [getattr(layer, s, None) for s in getattr(layer, "state", ())]
            arrays.append(getattr(layer, "rng_made", None))  # (reading .rng would make one for every layer)
        return tuple(map(id, arrays))

    def __call__(self, xb, yb, callbacks, sums):
        """The step on this batch by the graph (captured first when it is time): its score; or
        None when the ordinary step must run it."""
        key = (xb.shape, xb.dtype, yb.shape, yb.dtype, sums is None or sums.shape, tuple(map(id, callbacks)),
               self._modes())
        return self._run(key, lambda: self._blocked(callbacks), lambda: self._capture_step(key, xb, yb, callbacks, sums),
                         lambda: self._replay(xb, yb, sums))

    def _capture_step(self, key, xb, yb, callbacks, sums):
        opt = self.step.optimizer
        opt.begin_step()  # the host's part of this step, outside the graph
        try:
            score = self._capture(key, xb, yb, sums, lambda x, y, s: self.step(x, y, callbacks, sums=s, captured=True))
        except TrainingError:
            opt.iterations -= 1
            raise
        if score is None:
            opt.iterations -= 1  # the ordinary step runs this batch
        return score

    def _host_part(self) -> None:
        self.step.optimizer.begin_step()

    def _launch(self, sums):
        self.step.count += 1
        return super()._launch(sums)


def evaluation_blocker(step) -> str | None:
    """Why the evaluation of a batch by ``step``'s model, loss and metrics cannot be captured in
    a CUDA graph, or None when it can (a layer whose evaluation reads the device says so with
    ``capturable_in_evaluation = False``)."""
    why = step.model.backend.graphs_unsupported() or _parts_blocker(step)
    if why:
        return why
    for layer in step.model.run_order:
        if getattr(layer, "capturable_in_evaluation", True) is False:
            return f"the layer {_name(layer)} reads the device when it evaluates"
    return None


def _parts_blocker(step, more=()) -> str | None:
    """Why the model's layers, the loss, the metrics (and ``more``: (kind, part) pairs) cannot be
    captured: a plugin, or a part that says so."""
    parts = [("layer", layer) for layer in step.model.run_order] + [("loss", step.loss)]
    parts += [("metric", m) for m in getattr(step.tracker, "metrics", ())]
    for kind, part in [*parts, *more]:
        if not _ours(part):
            return f"the {kind} {_name(part)} is a plugin, which may keep per-step values on the host"
        if getattr(part, "capturable", True) is False:
            return f"the {kind} {_name(part)} cannot be captured"
    return None


class EvaluationGraph(_Graph):
    """The CUDA graph of one evaluation batch (the model's forward in its current mode, the loss
    and the metric sums: :meth:`~dlrun.training.step.TrainingStep.score`), replayed for every
    batch of that shape, as the training step's graph is; the validation of each epoch then
    costs a few launches a batch instead of one per operation."""

    def __init__(self, step, mode="auto"):
        super().__init__(step, mode)
        self._why = False  # evaluation_blocker, once decided

    def _blocked(self) -> str | None:
        if self._why is False:
            self._why = evaluation_blocker(self.step)
        return self._why

    def _bound_now(self) -> tuple:
        """What a replay reads that a restore may rebind: the parameters and the layers' state."""
        arrays = [p.data for _, p in self.step.model.named_parameters()]
        for layer in self.step.model.layers:
            arrays += [getattr(layer, s, None) for s in getattr(layer, "state", ())]
        return tuple(map(id, arrays))

    def __call__(self, xb, yb, sums):
        """The score of this batch by the graph (captured first when it is time), or None when
        the ordinary path must compute it."""
        key = (xb.shape, xb.dtype, yb.shape, yb.dtype, sums is None or sums.shape, self._modes())
        step = self.step
        return self._run(key, self._blocked,
                         lambda: self._capture(key, xb, yb, sums, lambda x, y, s: step.score(step.model.forward(x), y, s)),
                         lambda: self._replay(xb, yb, sums))
