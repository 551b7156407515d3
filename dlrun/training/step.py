"""One optimisation step, and what watches it.

:class:`TrainingStep` owns the training step: forward through the model, the loss (and the sums
of ``train.metrics``), backward down to the first layer that needs it, the gradient
accumulation window, the sum of the gradients over the ranks of a data-parallel run (the one
collective of a step, :mod:`dlrun.parallel`), the regularizers, the clipping hook (callbacks'
``on_after_backward``), the optimizer update and the step count. Everything else that runs a step — the first step's
contract checks, the non-finite replay that names a layer, ``dlrun time`` and ``dlrun check`` — is
a :class:`StepObserver` of this same step (as Chainer's extensions observe its Updater), so a
feature added to the step reaches all of them. The fast path, with no observer, pays nothing for
them: it is the plain sequence of calls.
"""
from __future__ import annotations

import inspect

from .accumulate import GradAccumulator
from .capture import EvaluationGraph, StepGraph
from ..backend import array_module
from ..model.contract import defined_at, mismatch
from ..errors import ContractError


class StepObserver:
    """Hooks of an observed step, called in the order the step runs them; each does nothing
    unless overridden. ``k`` is a position in the model's execution order (the layer is
    ``model.layers[model.order[k]]``). An observer may raise to stop the step."""

    checks_layers = False  # True: every layer call runs with its contract checks (Sequential.checked_call)

    def begin(self, xb, yb) -> None: ...
    def forward(self, k: int, layer, out) -> None: ...
    def loss(self, value, out, y) -> None: ...
    def metrics(self) -> None: ...
    def loss_backward(self, dy, out) -> None: ...
    def backward(self, k: int, layer, dx) -> None: ...
    def regularizer(self, p, reg) -> None: ...
    def update(self, optimizer) -> None: ...   # before the optimizer's step
    def updated(self, optimizer) -> None: ...  # after it
    def end(self) -> None: ...


class TrainingStep:
    """The training step of a model, a loss and an optimizer (see the module docstring).

    Args:
        model: a built :class:`~dlrun.model.Sequential`.
        loss: a loss instance.
        optimizer: an optimizer instance (``setup`` is called here).
        regularizer: run-wide default regularizer for parameters without their own, or None.
        accumulate: batches per optimizer step, their gradients averaged by size.
        tracker: the :class:`~dlrun.metrics.Tracker` of ``train.metrics``.
        owner: what the callbacks' ``on_after_backward`` receives (the trainer).
        first_check: the observer of the first step (:class:`dlrun.training.step.FirstStep`): what the
            loss, the regularizers and the optimizer return is checked on it, once.
        cuda_graph: ``"auto"`` captures the step in a CUDA graph where it can be
            (:mod:`dlrun.training.capture`), True the same but a failed capture raises, False never.
    """

    def __init__(self, model, loss, optimizer, regularizer=None, accumulate: int = 1, tracker=None, owner=None,
                 first_check: StepObserver | None = None, cuda_graph="auto"):
        self.model, self.loss, self.optimizer, self.tracker, self.owner = model, loss, optimizer, tracker, owner
        self.classification = getattr(loss, "task", "classification") == "classification"
        self.accumulator = GradAccumulator(model) if accumulate > 1 else None
        params = model.named_parameters()
        if "arena" in inspect.signature(optimizer.setup).parameters:  # a plugin's setup may not take it
            optimizer.setup(params, arena=model.arena)
        else:
            optimizer.setup(params)
        self.regularized = regularized(model, regularizer)
        # a data-parallel run's ranks (dlrun.parallel): each step sums the gradients over them
        self.world = model.world if model.world.size > 1 else None
        arena = model.arena
        packed = set() if arena is None else {id(p) for p in arena.params}
        self._loose = [p for _, p in params if p.trainable and id(p) not in packed]
        self.count = 0  # optimizer steps taken
        self.observers: list[StepObserver] = []
        self.first_check = first_check  # None once the first step has passed it
        # the step's CUDA graph (GPU only); None runs every step the ordinary way
        graphs = cuda_graph is not False and model.backend.name == "gpu"
        self.graph = StepGraph(self, cuda_graph) if graphs else None
        self.evaluation_graph = EvaluationGraph(self, cuda_graph) if graphs else None  # (of evaluation batches)

    def __call__(self, xb, yb, callbacks=(), window=None, sums=None, part=None, *, captured=False):
        """One step on a device batch; returns ``(batch loss × batch size, correct predictions)``
        as device scalars (nothing is read back to the host, so on GPU the step never waits for
        it). ``window``: with gradient accumulation, the batch's ``(share, first, last)`` in its
        step's window (:func:`dlrun.training.accumulate.windows`); the optimizer steps after a window's
        last batch. ``sums``: the epoch's metric sums on the device, which the step adds to.
        ``part``: in a data-parallel run, the fraction of the global batch that ``xb`` is on this
        rank (None: the whole batch, one process). ``captured``: the call a CUDA graph records
        (:mod:`dlrun.training.capture`), which leaves the host's part of the optimizer's step and
        the count to each replay."""
        if self.observers or self.first_check is not None:
            return self.observed(xb, yb, callbacks, window, sums, part=part)
        graph = self.graph
        if graph is not None and window is None and part is None and not captured:
            score = graph(xb, yb, callbacks, sums)
            if score is not None:
                return score
        model, loss = self.model, self.loss
        out = model.forward(xb, yb)
        score = self.score(out, yb, sums)
        if part is None:
            model.backward(loss.backward())
        else:
            model.backward(loss.backward() * part)
        if window is not None and not self.accumulated(window):
            return score
        if self.world is not None:
            self.sum_gradients()
        for p, reg in self.regularized:
            reg.add_gradient(p.data, p.grad)
        for cb in callbacks:
            cb.on_after_backward(self.owner)
        if captured:
            self.optimizer.update()
            return score
        self.optimizer.step()
        self.count += 1
        return score

    def observed(self, xb, yb, callbacks=(), window=None, sums=None, observers=None, part=None):
        """The same step, part by part, calling each observer's hooks (``observers``: these
        instead of the attached ones; the first step's check always comes first)."""
        observers = list(self.observers if observers is None else observers)
        if self.first_check is not None:
            observers.insert(0, self.first_check)
        model, loss, opt = self.model, self.loss, self.optimizer
        check = any(o.checks_layers for o in observers)
        run = model.run_order
        for o in observers:
            o.begin(xb, yb)
        h = xb
        for k, h in model.forward_parts(xb, yb, check):
            for o in observers:
                o.forward(k, run[k], h)
        value = loss.forward(h, yb)
        for o in observers:
            o.loss(value, h, yb)
        score = (len(yb) * value, loss.count_correct(h, yb) if self.classification else 0)
        if sums is not None:
            self.tracker.add(sums, h, yb, loss)
            for o in observers:
                o.metrics()
        dy = loss.backward()
        for o in observers:
            o.loss_backward(dy, h)
        if part is not None:
            dy = dy * part
        for k, dx in model.backward_parts(dy, check):
            for o in observers:
                o.backward(k, run[k], dx)
        if window is not None and not self.accumulated(window):
            for o in observers:
                o.end()
            return score
        if self.world is not None:
            self.sum_gradients()
        for p, reg in self.regularized:
            reg.add_gradient(p.data, p.grad)
            for o in observers:
                o.regularizer(p, reg)
        for cb in callbacks:
            cb.on_after_backward(self.owner)
        for o in observers:
            o.update(opt)
        opt.step()
        for o in observers:
            o.updated(opt)
        self.count += 1
        self.first_check = None
        for o in observers:
            o.end()
        return score

    def sum_gradients(self) -> None:
        """The gradients summed over a data-parallel run's ranks: one collective over the model's
        flat gradient buffer, which carries the ranks' stop flags in its spare elements (each
        rank's gradient is already scaled by its part of the global batch, so the sum is the
        global batch's gradient, as one process computes it)."""
        arena = self.model.arena
        if arena is not None:
            arena.adopt()
            self.world.sum_gradients(arena.reduced, [p.grad for p in self._loose])
        else:
            self.world.sum_gradients(self.world.flags(), [p.grad for p in self._loose])

    def score(self, out, y, sums=None):
        """(batch loss × batch size, correct predictions; 0 for regression), to be added up over
        an epoch: numpy scalars on the CPU, 0-d device arrays on the GPU (never read here). The
        metrics of train.metrics add theirs to ``sums`` (before backward may reuse ``out``)."""
        total = len(y) * self.loss.forward(out, y)
        if sums is not None:
            self.tracker.add(sums, out, y, self.loss)
        if not self.classification:
            return total, 0
        return total, self.loss.count_correct(out, y)

    def evaluate(self, xb, yb, sums=None):
        """:meth:`score` of the model's output for an evaluation batch (the model in the mode it
        is in), by the evaluation's CUDA graph where there is one (GPU)."""
        graph = self.evaluation_graph
        if graph is not None:
            score = graph(xb, yb, sums)
            if score is not None:
                return score
        return self.score(self.model.forward(xb), yb, sums)

    def accumulated(self, window) -> bool:
        """Fold the gradients just computed into the window's (``window``: share, first, last);
        True when the window is complete and the step may run."""
        share, first, last = window
        if not last:
            self.accumulator.add(share, first)
            return False
        self.accumulator.finish(share, first)
        return True

    def penalty(self):
        """The regularizers' penalty on the current weights (added to the reported losses): a
        scalar, on the device for the built-in regularizers."""
        return penalty(self.regularized)


def regularized(model, regularizer=None) -> list:
    """``[(parameter, regularizer)]``: each trainable parameter's own regularizer, or the run-wide
    ``regularizer`` for those that take it (``regularize``)."""
    return [(p, p.regularizer or regularizer) for _, p in model.named_parameters()
            if p.trainable and (p.regularizer or (regularizer and p.regularize))]


def penalty(pairs: list):
    """The summed penalty of ``regularized`` pairs on the current weights (a scalar, on the
    model's device for the built-in regularizers: read it back with ``Backend.read_back``)."""
    return sum(reg.penalty(p.data) for p, reg in pairs) if pairs else 0.0


_OPTIMIZER_OWN = {"learning_rate", "params", "state", "iterations", "spec"}


_NEW = object()


def _same(a, b) -> bool:
    return a == b or (a != a and b != b)  # NaN (an option left at NaN for 'off') equals itself


def _public(obj) -> dict:
    """A comparable summary of an object's public attributes: numbers by value, containers by
    length and arrays by their bytes. Excluded by the caller: the optimizer's own state; here:
    arrays that share memory with a parameter or gradient (a view of the flat parameter buffer
    is the parameters, which checkpoints hold)."""
    params = [a for _, p in getattr(obj, "params", []) for a in (p.data, p.grad) if a is not None]
    out = {}
    for k, v in vars(obj).items():
        if k.startswith("_"):
            continue
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            shares = getattr(array_module(v), "may_share_memory", None)
            if shares is not None and any(shares(v, a) for a in params if array_module(a) is array_module(v)):
                continue
            out[k] = (tuple(v.shape), str(v.dtype), array_module(v).asnumpy(v).tobytes()
                      if hasattr(array_module(v), "asnumpy") else v.tobytes())
        elif isinstance(v, (dict, list, set, tuple)):
            out[k] = (type(v).__name__, len(v))
        elif isinstance(v, (int, float, complex, str, bool)) or v is None:
            out[k] = v
    return out


class FirstStep(StepObserver):
    """The checks of the first training step (a :class:`~dlrun.training.step.StepObserver`): what the loss,
    the regularizers and the optimizer return (the layers are checked by the model's first
    calls). A plugin that breaks its contract is named here instead of by a numpy error an epoch
    later. With gradient accumulation every batch up to the first step's last is observed."""

    def __init__(self, model, loss):
        self.model, self.loss_fn = model, loss
        self._before = None
        self.value = None  # the first step's loss, as the loss returned it (on the device: read only after the step)

    def loss(self, value, out, y):
        self.value = value
        if getattr(value, "shape", ()) != () or not hasattr(value, "__float__"):
            shape = getattr(value, "shape", None)
            got = f"shape {tuple(shape)} {value.dtype}" if shape is not None else repr(value)
            loss = self.loss_fn
            raise ContractError(f"the loss {loss!r}: forward returned {got}; expected a scalar, the mean loss over "
                                f"the batch (a missing .mean()?){defined_at(loss, 'forward')}")

    def loss_backward(self, dy, out):
        m = self.model
        problem = mismatch(dy, out.shape, {out.dtype}, m.backend, m.dtype)
        if problem:
            loss = self.loss_fn
            raise ContractError(f"the loss {loss!r}: backward returned dL/dz as {problem} (the shape and dtype of "
                                f"the model's output){defined_at(loss, 'backward')}")

    def regularizer(self, p, reg):
        penalty = reg.penalty(p.data)
        if getattr(penalty, "shape", ()) != () or not hasattr(penalty, "__float__"):
            raise ContractError(f"the regularizer {reg!r}: penalty returned {penalty!r:.60}; expected a scalar "
                                f"(the sum over the tensor)")

    def update(self, optimizer):
        self._before = _public(optimizer)

    def updated(self, optimizer):
        after = _public(optimizer)
        changed = [k for k, v in after.items() if k not in _OPTIMIZER_OWN and not _same(self._before.get(k, _NEW), v)]
        if changed:
            raise ContractError(f"the optimizer {optimizer!r} changed self.{changed[0]} in its first step; checkpoints "
                                f"do not save it, so --resume would not continue the run exactly. Keep per-parameter "
                                f"buffers in slots (slots = ('velocity',), then state['velocity'] in _update), count "
                                f"steps with self.iterations, and name scratch and diagnostic attributes with a leading "
                                f"underscore (self._last_norm)")
