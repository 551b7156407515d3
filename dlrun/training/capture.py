"""The training step captured in a CUDA graph and replayed per batch (``train.cuda_graph``).

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
"""
from __future__ import annotations

import weakref

from ..errors import TrainingError

WARMUP = 2  # ordinary steps of a batch shape before it is captured
_GRAPHS = weakref.WeakSet()  # every StepGraph alive, for pool_bytes


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
    parts = [("layer", layer) for layer in step.model.run_order] + [("loss", step.loss)]
    parts += [("metric", m) for m in getattr(step.tracker, "metrics", ())]
    parts += [("regularizer", reg) for _, reg in step.regularized]
    for kind, part in parts:
        if not _ours(part):
            return f"the {kind} {_name(part)} is a plugin, which may keep per-step values on the host"
        if getattr(part, "capturable", True) is False:
            return f"the {kind} {_name(part)} cannot be captured"
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


class StepGraph:
    """The CUDA graph of one training step and what it needs around each replay.

    Args:
        step: the :class:`~dlrun.training.step.TrainingStep`.
        mode: ``"auto"`` (capture where :func:`blocker` allows) or ``True`` (the same, but a
            capture that fails raises instead of leaving the step uncaptured).
    """

    def __init__(self, step, mode="auto"):
        self.step, self.mode = step, mode
        self.graph = None  # a backend.Captured
        self.key = None  # the batch shapes and modes it was captured for
        self.inputs = None  # (x, y, sums) its static inputs
        self.bound = None  # the arrays it updates, as bound when captured
        self.why_not = None  # why the step is not captured (None: not decided yet, or captured)
        self.replays = 0
        self._pools = []  # every capture's memory pool: arrays from it may outlive its graph
        self._seen: dict = {}
        self._keep = []
        _GRAPHS.add(self)
        self._checked = None  # (callbacks, blocker) last decided

    @property
    def status(self) -> str:
        """"captured" or "not captured: why", as summary.json and ``dlrun time`` say it."""
        if self.graph is not None or self.replays:
            return "captured"
        return f"not captured: {self.why_not or f'no batch shape has run the {WARMUP} ordinary steps before its capture'}"

    def _blocked(self, callbacks) -> str | None:
        cbs = tuple(callbacks)
        if self._checked is None or self._checked[0] != cbs:
            self._checked = (cbs, blocker(self.step, cbs))
        return self._checked[1]

    def _key(self, xb, yb, sums, callbacks):
        model = self.step.model
        return (xb.shape, xb.dtype, yb.shape, yb.dtype, sums is None or sums.shape, tuple(map(id, callbacks)),
                tuple((layer.training, layer.buffers.enabled, layer.needs_input_grad) for layer in model.run_order))

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
        if self.graph is not None:
            if self.key == self._key(xb, yb, sums, callbacks):
                if self._bound_now() == self.bound:
                    return self._replay(xb, yb, sums)
                self.graph = None  # the arrays it writes were replaced: capture again
                self._seen.clear()
            return None
        if self.why_not is not None and self.why_not.startswith("the capture failed"):
            return None
        why = self._blocked(callbacks)
        if why is not None:
            self.why_not = why
            return None
        key = self._key(xb, yb, sums, callbacks)
        self._seen[key] = seen = self._seen.get(key, 0) + 1
        if seen <= WARMUP:
            return None
        return self._capture(key, xb, yb, callbacks, sums)

    def _capture(self, key, xb, yb, callbacks, sums):
        step, opt = self.step, self.step.optimizer
        backend = step.model.backend
        x, y = xb.copy(), yb.copy()  # the static inputs (copies: the batch may be a view of the data)
        s = None if sums is None else sums.copy()
        before = _arrays_of(step)
        opt.begin_step()  # the host's part of this step, outside the graph
        try:
            graph = backend.capture(lambda: step(x, y, callbacks, sums=s, captured=True))
        except Exception as e:
            opt.iterations -= 1  # the ordinary step runs this batch
            self.why_not = f"the capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            if self.mode is True:
                raise TrainingError(f"train.cuda_graph: true, but {self.why_not}; set train.cuda_graph: auto or "
                                    f"false to train without a CUDA graph") from e
            return None
        self._pools.append(graph.pool)
        # the arrays the step's parts held before and after the capture, which the graph may read
        # or write: kept alive with it, so that their memory is never handed to anything else
        # (Backend.capture gives the default pool's other unused blocks back to the device)
        self._keep = before + _arrays_of(step)
        self.graph, self.key, self.inputs, self.why_not = graph, key, (x, y, s), None
        self.bound = self._bound_now()
        return self._launch(sums)

    def _replay(self, xb, yb, sums):
        x, y, s = self.inputs
        x[...] = xb
        y[...] = yb
        if sums is not None:
            s[...] = sums
        self.step.optimizer.begin_step()
        return self._launch(sums)

    def _launch(self, sums):
        self.graph.replay()
        if sums is not None:
            sums[...] = self.inputs[2]
        self.step.count += 1
        self.replays += 1
        return self.graph.result
