"""Training faults: where a non-finite value first appeared, and a clean stop on SIGINT/SIGTERM.

Non-finite values are detected once per epoch, not per batch, so the normal path pays nothing
per batch: the guard copies the parameters and optimizer state when an epoch starts (on the GPU
into page-locked host memory, queued, so the host never waits for the copy) and, when it ends,
checks that the epoch's summed loss and every parameter are finite (a sum over the weights, read
back with the epoch's other values). When one
is not, it restores the copy and replays the epoch batch by batch, checking each layer's output
(forward), each ``dx`` and parameter gradient (backward) and the updated parameters, and names
the first that is not finite. It then restores the copy again, so the model holds the last good
state (the end of the previous epoch).
"""
from __future__ import annotations

import copy
import math
import signal
import threading
from contextlib import contextmanager

import numpy as np

from ..backend import array_module
from ..errors import Interrupted, NonFiniteError
from .hooks import Callback
from .step import StepObserver


def nonfinite_kind(a) -> str | None:
    """'NaN' or 'inf' when the array (or scalar) holds one (NaN wins), else None."""
    xp = array_module(a)
    if bool(xp.isfinite(a).all()):
        return None
    return "NaN" if bool(xp.isnan(a).any()) else "inf"


_BLOCK = 1 << 20  # elements per block of the GPU's finiteness check (4 MiB of float32 at a time)


class NonFiniteGuard:
    """Per-epoch snapshot of a trainer's state, the end-of-epoch check, and the diagnosing replay."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.params = None
        self.shuffle_state = None
        # what a batch changes, listed once: the parameters (the model's flat buffer when it has
        # one, plus any tensor left out of it) and the optimizer's state buffers (updated in
        # place, so the same arrays every epoch); layers with declared state or random draws
        t = trainer
        arena = t.model.arena
        packed = {id(p) for p in arena.params} if arena is not None else set()
        self._arena = arena
        self._params = ([arena.data] if arena is not None else []) + [
            p.data for _, p in t.model.named_parameters() if id(p) not in packed]
        self._stateful = [layer for layer in t.model.layers if layer.state or layer.stochastic]
        # the usual case: every weight is in the model's flat buffer, checked with one dot
        self._one_flat = len(self._params) == 1 and self._params[0].ndim == 1
        self.states, self.rngs = {}, {}
        self._copies = None  # [(snapshot, live array)] of every mark, listed once
        self._optim_from = None  # the optimizer's state arrays the copies were listed for

    def _optim(self) -> list:
        opt = self.trainer.optimizer
        buffers = getattr(opt, "buffers", None)
        if buffers is not None:
            return buffers()
        return [slots[s] for slots in opt.state.values() for s in opt.slots]  # a plugin without the base class

    def mark(self, shuffle_state: dict | None = None, position=None) -> None:
        """Copy everything a batch changes (called when an epoch starts, or resumes).

        ``shuffle_state`` is the shuffling generator's state before it drew this epoch's order;
        ``position`` the :class:`~dlrun.training.position.EpochPosition` a resumed epoch continues from.
        The copies live in host memory, allocated once and refilled in place: on the GPU it is
        page-locked, so a mark queues one copy per array and the host does not wait, and the GPU
        holds no second copy of the weights and optimizer state.
        """
        t = self.trainer
        self.shuffle_state, self.position = shuffle_state, position
        if self._arena is not None and self._arena.dirty:
            self._arena.adopt()
        optim = self._optim()
        b = t.backend
        if self._copies is None or optim is not self._optim_from and (
                len(optim) != len(self.optim) or any(a is not c for a, c in zip(optim, self._optim_from))):
            # first mark, or a plugin optimizer's state arrays changed (added lazily, replaced)
            if self.params is None:
                self.params = [b.host_buffer(a.shape, a.dtype) for a in self._params]
            self.optim = [b.host_buffer(a.shape, a.dtype) for a in optim]
            self._copies = list(zip(self.params + self.optim, self._params + optim))
        self._optim_from = optim
        b.copy_out(self._copies)
        if self._stateful:
            self.states, self.rngs = {}, {}  # rngs: only layers that draw random numbers (copies are slow)
            for layer in self._stateful:
                self.states[id(layer)] = {a: copy.deepcopy(getattr(layer, a)) for a in layer.state}
                if layer.stochastic:
                    try:
                        self.rngs[id(layer)] = copy.deepcopy(layer.rng)
                    except Exception:  # a device generator that cannot be copied: replay is then approximate
                        pass
        # the trainer's counters; its arrays (weights, optimizer buffers) are copied above, into
        # buffers kept across epochs, so a mark allocates nothing
        opt = t.optimizer
        self.counters = {"step": t.training_step.count, "learning_rate": opt.learning_rate}  # (as Trainer.state_dict)
        self.iterations = opt.iterations  # (the optimizer's own counter, beside its buffers)

    def restore(self, rewind_shuffle: bool = False):
        """Put the state copied by :meth:`mark` back (and the shuffling generator, if asked);
        returns the position it stands at (None: the start of the epoch)."""
        t = self.trainer
        if rewind_shuffle and self.shuffle_state is not None:
            t.shuffle_rng.bit_generator.state = self.shuffle_state
        if self._arena is not None and self._arena.dirty:
            self._arena.adopt()
        for live, saved in zip(self._params + self._optim(), self.params + self.optim):
            t.backend.copy_in(live, saved)
        for layer in self._stateful:
            for a, v in self.states[id(layer)].items():
                setattr(layer, a, copy.deepcopy(v))
            if id(layer) in self.rngs:
                layer.rng = copy.deepcopy(self.rngs[id(layer)])
        t.load_state_dict(self.counters)
        t.optimizer.iterations = self.iterations
        return self.position

    def kept(self, position):
        """The position an interrupt leaves for a checkpoint to continue from: ``position`` (an
        EpochPosition between two batches) when the state there is finite; else the epoch is
        undone, back to where it started or was resumed (:meth:`restore`)."""
        return position if self.healthy(position.loss_sum) else self.restore(rewind_shuffle=True)

    def total(self):
        """A sum over every parameter that is finite when they all are (NaN and inf survive it):
        a scalar on the model's device, queued, for :meth:`healthy` (on the GPU, read back with
        the epoch's other values in one transfer)."""
        if self._arena is not None and self._arena.dirty:
            self._arena.adopt()
        params = self._params
        # usually there is one array, the model's flat buffer, and its dot with itself (a sum of
        # squares) is the cheapest reduction
        if self._one_flat:
            p, xp = params[0], self.trainer.backend.xp
            if xp is np:
                return p.dot(p)
            # CuPy's dot of the whole buffer took a copy of it first: the squares a block at a time
            return sum(xp.square(p[i:i + _BLOCK]).sum() for i in range(0, p.size, _BLOCK))
        return sum(a.sum() for a in params) if params else 0.0

    def healthy(self, train_loss: float, total=None) -> bool:
        """True when the epoch's loss and every parameter are finite; ``total`` is :meth:`total`
        read back (None: computed and read here)."""
        if not math.isfinite(train_loss):
            return False
        # fast path: a sum is finite when no element is NaN/inf (a sum of finite values that
        # overflows falls back to the exact elementwise test)
        total = float(self.total() if total is None else total)
        return math.isfinite(total) or all(nonfinite_kind(a) is None for a in self._params)

    def diagnose(self, epoch: int, batches, callbacks=(), first: int = 0) -> NonFiniteError:
        """Replay the epoch from the snapshot, checking every step; return the error to raise.
        ``batches`` start after the epoch's first ``first`` (a resumed epoch's batches done)."""
        self.restore()
        where = None
        world = self.trainer.world
        # several ranks replay their parts together: each notes its first non-finite value and
        # finishes the step (the others wait in its collectives), then they agree on the first
        finder = FirstNonFinite(self.trainer.model, self.trainer.loss, note=world is not None)
        step = self.trainer.training_step
        try:  # a layer may raise instead (an Embedding index out of range): the restore still runs
            with np.errstate(all="ignore"):
                for b, (xb, yb, window, part) in enumerate(batches, start=first + 1):
                    try:
                        step.observed(xb, yb, callbacks, window, observers=[finder], part=part)
                    except _Found as found:
                        where = found.where
                        break
                    if world is not None:
                        hit = world.first(finder.noted)
                        if hit is not None:
                            where = f"{hit[1]} (rank {hit[0]})"
                            break
        finally:
            self.restore()  # leave the last good state in the model (the end of the previous epoch)
        kept = (f"the model holds the state after batch {first} of epoch {epoch}" if first
                else f"the model holds the state after epoch {epoch - 1}" if epoch > 1
                else "no epoch finished, so there is no good state to keep")
        if where is None:
            return _everywhere(world, NonFiniteError(f"epoch {epoch}: the training loss or a weight became non-finite, but a replay "
                                  f"of the epoch did not reproduce it (a stochastic layer?); {kept}",
                                  epoch, None, None))
        return _everywhere(world, NonFiniteError(f"epoch {epoch}, batch {b}: {where}; {kept}. Lower the learning "
                                                 f"rate, clip gradients or check the data and the named layer",
                                                 epoch, b, where))


def _everywhere(world, error):
    """``error``, marked as met by every rank of a data-parallel run together (they agreed on it)."""
    error.everywhere = world is not None
    return error


class _Found(Exception):
    """The first non-finite value of a replayed step, and where it appeared."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


class FirstNonFinite(StepObserver):
    """Stops a replayed training step at the first NaN or inf: in the input batch, a layer's
    output (forward), the loss, its gradient, a layer's parameter gradient or ``dx`` (backward),
    a regularizer's gradient, or a weight after the optimizer's step."""

    def __init__(self, model, loss, note: bool = False):
        self.model, self.loss_fn = model, loss
        self.note = note  # keep the first in ``noted`` and let the step finish (a rank of several)
        self.noted: tuple[int, str] | None = None  # (after the ranks' gradient sum?, where)

    def _stop(self, a, before: str, after: str = "", summed: bool = False) -> None:
        if self.noted is None and (kind := nonfinite_kind(a)) is not None:
            if not self.note:
                raise _Found(f"{before}{kind}{after}")
            # (after the gradients' sum over the ranks a value may only carry another rank's)
            self.noted = (int(summed), f"{before}{kind}{after}")

    def begin(self, xb, yb):
        self._stop(xb, "the input batch contains ")

    def forward(self, k, layer, out):
        self._stop(out, f"{self.model.label(self.model.order[k])} {layer!r} produced ", " in forward (its output)")

    def loss(self, value, out, y):
        self._stop(value, f"the loss {self.loss_fn!r} is ", " (its input was finite)")

    def loss_backward(self, dy, out):
        self._stop(dy, f"the loss {self.loss_fn!r} produced ", " in backward")

    def backward(self, k, layer, dx):
        i = self.model.order[k]
        at = self.model.label(i)
        for name, p in layer.params.items():
            if p.trainable:
                self._stop(p.grad, f"{at} {layer!r} produced ", f" in backward (the gradient of {name})")
        for m, d in enumerate(dx if isinstance(dx, (tuple, list)) else (dx,)):
            if d is not None:
                what = "dx, the gradient of its input" if not isinstance(dx, (tuple, list)) else \
                    f"the gradient of its input {m}"
                self._stop(d, f"{at} {layer!r} produced ", f" in backward ({what})")

    def regularizer(self, p, reg):
        self._stop(p.grad, f"the regularizer {reg!r} produced ", " in a gradient", summed=True)

    def updated(self, optimizer):
        for i, layer in self.model.owners():
            for name, p in layer.params.items():
                self._stop(p.data, f"the optimizer step made {self.model.label(i)}.{name} ", " (gradients were finite: "
                                                                                         "the step overflowed)", summed=True)


class StopOnSignal(Callback):
    """Turns SIGINT/SIGTERM (caught by :func:`catch_signals`) into Interrupted at a batch boundary.

    A signal that arrives once the last epoch has ended (``epochs``, or the epoch an early
    stopping control in ``stoppers`` ends) stops nothing: the run finishes (summary.json,
    checkpoints), and the caller reports the signal afterwards (``signum``)."""

    def __init__(self, epochs: int | None = None, stoppers=()):
        self.signum: int | None = None
        self.epoch = self.batch = self.batches = 0
        self.every = 1
        self.epochs, self.stoppers = epochs, list(stoppers)
        self.finishing = False  # the run's ending: signals are only recorded
        self.world = None  # several ranks: they stop on the signal they agreed on in a step's collective

    def on_train_begin(self, trainer):
        self.every = getattr(trainer, "accumulate", 1)  # steps end windows of this many batches
        self.world = getattr(trainer, "world", None)
        if self.world is not None:  # (what a report of a rank that ended says)
            self.world.at = self.where

    def where(self) -> str:
        """Where training stands: 'epoch 2, after batch 14 of 20'."""
        return f"epoch {self.epoch}, after batch {self.batch} of {self.batches}" if self.batch else \
            f"epoch {self.epoch}, before its first batch"

    def received(self, signum: int) -> None:
        """A SIGINT or SIGTERM arrived (from :func:`catch_signals`)."""
        self.signum = self.signum or signum
        if self.world is not None:
            self.world.pending = self.world.pending or signum

    def _pending(self) -> int | None:
        if self.world is None:
            return self.signum
        if self.world.agreed:
            self.signum = self.world.agreed
            return self.signum
        return None

    def on_epoch_begin(self, epoch, batches):
        self.epoch, self.batch, self.batches = epoch, 0, batches

    def on_epoch_resume(self, epoch, batches_done):
        self.batch = batches_done

    def on_batch_end(self, epoch, batch):
        self.batch = batch
        # the last batch stops at epoch end; inside a window of accumulated gradients, its last does
        if batch < self.batches and batch % self.every == 0 and self._pending() is not None:
            self._stop()

    def on_epoch_end(self, epoch, metrics):
        if self.epochs is not None and epoch >= self.epochs or any(
                getattr(c, "stopped_epoch", None) == epoch for c in self.stoppers):
            self.finishing = True  # training is over: the ending runs whatever arrives
        elif self._pending() is not None:
            self._stop()

    def record(self) -> dict:
        """Where training stopped, for the checkpoint's metadata."""
        return {"signal": signal.Signals(self.signum).name, "epoch": self.epoch,
                "batches_done": self.batch, "batches": self.batches}

    def _stop(self):
        done = "at the end of" if self.batch >= self.batches else f"after batch {self.batch} of {self.batches} of"
        e = Interrupted(f"{signal.Signals(self.signum).name} received: training stopped {done} epoch {self.epoch}",
                        self.signum)
        e.everywhere = self.world is not None  # several ranks stop together, on the signal they agreed on
        raise e


@contextmanager
def catch_signals(stop: StopOnSignal):
    """While active, SIGINT/SIGTERM set ``stop.signum``; a second one stops at once, unsaved
    (unless ``stop.finishing``: the run's ending, which is short, is never cut)."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.getsignal(s) for s in sigs}

    def handler(signum, frame):
        # several ranks: a launcher may pass one signal twice, and stops the ranks itself on a second Ctrl-C
        if stop.signum is not None and not stop.finishing and stop.world is None:
            err = Interrupted(f"second {signal.Signals(signum).name}: stopped at once without saving", signum)
            err.immediate = True
            raise err
        stop.received(signum)

    for s in sigs:
        if old[s] is not signal.SIG_IGN:  # a signal the parent set to be ignored (nohup) stays ignored
            signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)
