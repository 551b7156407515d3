"""Trainer: fit, evaluate and predict for a model, a loss and an optimizer.

Library code: it returns data and reports progress only through callbacks. Data is moved to
the device once (features memory-mapped from a file stay there and are read a batch at a time);
per-epoch metrics are accumulated on the device and read once per epoch.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .. import seeding
from ..backend import array_module
from ..data.mapped import Rows
from ..errors import Interrupted, NonFiniteError
from ..model import Sequential
from .accumulate import windows
from ..metrics import Tracker
from .hooks import Event, History, listening
from .position import EpochPosition
from .faults import NonFiniteGuard
from .step import FirstStep, TrainingStep, penalty
from .controls import control_states, load_control_states
from .preflight import balance_class_weights, check_label_range


_NO_VALIDATION = {"loss": None, "accuracy": None}


class Trainer:
    """Runs the training loop.

    Args:
        model: a built :class:`Sequential`.
        loss: a loss instance.
        optimizer: an optimizer instance (``setup`` is called here).
        regularizer: run-wide default regularizer for parameters without their own, or None.
        batch_size: samples per step (None: full batch).
        shuffle: reshuffle every epoch.
        seed: seeds the shuffling generator.
        drop_last: skip each epoch's last batch when it is smaller than ``batch_size``.
        accumulate: batches per optimizer step, their gradients averaged by size (see
            :mod:`dlrun.training.accumulate`).
        metrics: :class:`~dlrun.metrics.Metric` instances, set up (``dlrun.metrics.build``),
            recorded for the training and validation data as train_NAME and val_NAME.
        cuda_graph: capture the training step in a CUDA graph on the GPU: ``"auto"`` where it
            can be, True the same but a failed capture raises, False never (see
            :mod:`dlrun.training.capture`).
    """

    def __init__(self, model: Sequential, loss, optimizer, regularizer=None, batch_size: int | None = 32,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, accumulate: int = 1, metrics=(),
                 cuda_graph="auto"):
        self.model = model
        self.loss = loss
        self.optimizer = optimizer
        self.backend = model.backend
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.accumulate = accumulate
        self.shuffle_rng = seeding.shuffling(seed)
        self.epoch = 0
        # a point inside epoch ``epoch + 1`` that the state stands at (None: an epoch boundary):
        # set by a resume from a mid-epoch checkpoint, and by fit when an interrupt stops it
        self.position: EpochPosition | None = None
        self.tracker = Tracker(metrics, self.backend)
        # the one training step (what fit, the non-finite replay, dlrun time and dlrun check run)
        self.training_step = TrainingStep(model, loss, optimizer, regularizer, accumulate, self.tracker, self,
                                          FirstStep(model, loss), cuda_graph)
        self.classification = self.training_step.classification
        # a data-parallel run's ranks (dlrun.parallel), None in one process: each rank trains on
        # its part of every global batch and validates on its part of the validation data
        self.world = self.training_step.world
        # several ranks, a model that draws random numbers: every rank's layer generator states
        # (seeding.layer_states), gathered on rank 0 when an epoch ends or training stops, for
        # its checkpoints (a resume on as many ranks continues every rank's streams)
        self.rank_states: list[dict] | None = None
        self._draws = self.world is not None and any(layer.stochastic for layer in model.layers)
        self.controls: list = []  # the train: controls (clipping, schedule, early stopping): their state is the trainer's
        self._sums = None  # the epoch's metric sums on the device, which train_step adds to
        # the last batch's (loss × batch size as a device scalar, batch size), for callbacks that
        # log a step's loss in on_batch_end (reading it waits for the device: they read it every
        # few steps); set while a callback listens there
        self.batch_score = None
        self.monitor = None  # the metric the run watches (a metrics.monitor.Monitor), for its display
        self._listeners: list = []  # the callbacks of the last fit: they hear the controls' events

    def announce(self, event: Event) -> None:
        """Pass a training control's :class:`~dlrun.training.hooks.Event` to the callbacks of
        the current (or last) fit."""
        for cb in self._listeners:
            hear = getattr(cb, "on_event", None)
            if hear is not None:
                hear(event)

    @property
    def step(self) -> int:
        """Optimizer steps taken (the training step's count)."""
        return self.training_step.count

    @step.setter
    def step(self, value: int) -> None:
        self.training_step.count = value

    # -- state: what a checkpoint saves beside the weights, and the non-finite guard puts back ---
    def state_dict(self, keys: tuple | None = None) -> dict:
        """The training state beside the model's weights: ``epoch``, ``step``, ``position`` (an
        :class:`~dlrun.training.position.EpochPosition` inside an epoch, else None), ``shuffle``
        (the shuffling generator's state), ``optimizer`` (its ``state_dict``: slot arrays on the
        device and ``iterations``), ``learning_rate`` and ``controls`` (each stateful control's
        state, by type); ``keys`` picks some (the non-finite guard takes the counters every
        epoch). Arrays are the live ones, not copies."""
        return {k: _STATE[k](self) for k in (keys or _STATE)}

    def load_state_dict(self, state: dict) -> None:
        """Put back what :meth:`state_dict` gave; only the keys present are restored (a checkpoint
        leaves ``learning_rate`` to the schedule and the config). Optimizer arrays are copied into
        the optimizer's buffers (host arrays are moved to the device)."""
        if "epoch" in state:
            self.epoch = int(state["epoch"])
        if "step" in state:
            self.step = int(state["step"])
        if "position" in state:
            self.position = state["position"]
        if state.get("shuffle"):
            self.shuffle_rng.bit_generator.state = state["shuffle"]
        if "optimizer" in state:
            b = self.backend
            self.optimizer.load_state_dict({k: (v if k == "iterations" else b.asarray(v))
                                            for k, v in state["optimizer"].items()})
        if "learning_rate" in state:
            self.optimizer.learning_rate = state["learning_rate"]
        if "controls" in state:
            load_control_states(self.controls, state["controls"])

    # -- data on the device ---------------------------------------------------------------
    def to_device(self, x, y):
        """(x, y) on the model's device, contiguous, in the model's dtype (int64 labels): host
        arrays are copied once; arrays already there are used as they are when they match.
        Class labels are range-checked here, once: the losses index scores with them, and on
        GPU an index out of range is not an error but a read of another sample's scores."""
        ydt = np.int64 if self.classification else self.model.dtype
        yd = self._move(y, ydt) if y is not None else None
        if yd is not None and self.classification and len(yd):
            check_label_range(self.loss, self.model, int(yd.min()), int(yd.max()))
        if isinstance(x, Rows):  # larger than memory, maybe: each batch is read and moved when it is used
            return MappedBatches(x, lambda rows: self._move(rows, self.model.dtype), self.backend.to_host), yd
        return self._move(x, self.model.dtype), yd

    def _move(self, a, dtype):
        xp = self.backend.xp
        if array_module(a) is xp:
            return xp.ascontiguousarray(a, dtype=dtype)
        return self.backend.asarray(np.ascontiguousarray(a, dtype=dtype))  # one pass: cast while copying

    def fast_mode(self, on: bool) -> bool:
        """Switch the model (``train(fast=on)``) and the loss's buffers; returns ``on``.

        ``fit`` holds the fast mode across epochs and leaves it whenever code outside the loop
        (callbacks, validation, the non-finite replay) or the caller gets the model."""
        self.model.train(fast=on)
        pool = getattr(self.loss, "buffers", None)  # custom losses may not have any
        if pool is not None:
            pool.enabled = on
        return on

    def _penalty(self):
        return penalty(self.training_step.regularized)

    def fit(self, x, y, x_val=None, y_val=None, epochs: int = 10, callbacks=(), history: History | None = None) -> History:
        """Train until ``epochs`` epochs have run in total (resumes from ``self.epoch``)."""
        xd, yd = self.to_device(x, y)
        balance_class_weights(self.loss, self.model, yd)  # class_weights: balanced, from these labels
        has_val = x_val is not None and len(x_val) > 0
        val = self.to_device(x_val, y_val) if has_val else None
        n = len(xd)
        bs, batches = self.epoch_batches(n)
        used = min(n, batches * bs)  # the samples an epoch trains on (all unless drop_last)
        history = history or History()
        self._listeners = list(callbacks)
        for cb in callbacks:
            cb.on_train_begin(self)
        world = self.world
        # this rank's slice of each global batch (from its start) and its fraction of the batch
        parts = _parts(world, bs, used, batches) if world is not None else None
        in_order = ([(xd[s:s + bs], yd[s:s + bs]) for s in range(0, used, bs)]  # (mapped rows: read when used)
                    if not self.shuffle and not isinstance(xd, MappedBatches) else None)
        if in_order is not None and parts is not None:
            in_order = [(x[p], y[p]) for (x, y), (p, _) in zip(in_order, parts)]
        classify = self.classification
        backend, optimizer = self.backend, self.optimizer
        # the sums an epoch starts from: on the CPU immutable scalars, the same every epoch; on the
        # GPU 0-d arrays that += changes in place, so fresh ones each epoch
        zeros = (backend.zero(np.float64), backend.zero(np.int64))
        shared_zeros = zeros[0] is backend.zero(np.float64)
        self._guard = guard = NonFiniteGuard(self)
        start, self.position = self.position, None  # a mid-epoch resume continues its epoch
        if start is not None:
            start.check(n, bs, batches, self.shuffle, "--resume", self.tracker.described)
        step = self.training_step
        regularized = step.regularized
        # the per-batch hooks, called on the callbacks that do something in them
        after_backward, batch_end = listening(callbacks, "on_after_backward"), listening(callbacks, "on_batch_end")
        tracked = bool(self.tracker.metrics)
        fast = False
        epoch = done = 0
        # from the guard's mark until the epoch is recorded (its validation and callbacks done): code
        # that raises in between leaves a state that no checkpoint and metrics row describe together
        in_batches = False
        try:
            while self.epoch < epochs:
                epoch, done = self.epoch + 1, 0
                first = start.batches_done if start is not None else 0
                for cb in callbacks:
                    cb.on_epoch_begin(epoch, batches)
                    if first:
                        cb.on_epoch_resume(epoch, first)
                t0 = time.perf_counter() - (start.seconds if start is not None else 0.0)
                if not fast:  # this loop consumes outputs at once: buffers, no input grad
                    fast = self.fast_mode(True)
                shuffle_state = self.shuffle_rng.bit_generator.state if self.shuffle else None
                order = self.shuffle_rng.permutation(n) if self.shuffle else None
                order_d = backend.asarray(order) if order is not None else None
                loss_sum, correct = zeros if shared_zeros else (backend.zero(np.float64), backend.zero(np.int64))
                own = _so_far(start, world) if start is not None else None  # a resumed epoch: its batches' sums
                if own is not None:
                    loss_sum, correct = loss_sum + own[0], correct + own[1]
                if tracked:  # (skipped without metrics: spiral's 1000 one-batch epochs felt the calls, +2.5%)
                    self._sums = self.tracker.zeros(own[2] if own is not None else None)
                guard.mark(shuffle_state, start)
                in_batches = True
                start = None
                done = first
                plan = windows(batches, bs, used, self.accumulate, first) if self.accumulate > 1 else None
                for b in range(first, batches):
                    if in_order is not None:
                        xb, yb = in_order[b]
                    elif parts is None:
                        idx = order_d[b * bs:(b + 1) * bs] if order_d is not None else slice(b * bs, (b + 1) * bs)
                        xb, yb = xd[idx], yd[idx]
                    else:
                        p = parts[b][0]
                        lo, hi = b * bs + p.start, b * bs + p.stop
                        idx = order_d[lo:hi] if order_d is not None else slice(lo, hi)
                        xb, yb = xd[idx], yd[idx]
                    if parts is None:
                        batch_loss, batch_correct = step(xb, yb, after_backward, plan[b - first] if plan else None,
                                                         self._sums)
                    else:  # (several ranks: this rank's part of the batch)
                        batch_loss, batch_correct = step(xb, yb, after_backward, plan[b - first] if plan else None,
                                                         self._sums, parts[b][1])
                    loss_sum += batch_loss
                    if classify:  # regression scores 0: adding it would still be a launch on GPU
                        correct += batch_correct
                    done = b + 1
                    if batch_end:
                        self.batch_score = batch_loss, len(yb)
                        for cb in batch_end:
                            cb.on_batch_end(epoch, done)
                if world is not None:  # the epoch's sums over every rank's part (one collective)
                    loss_sum, correct = self._sum_over_ranks(loss_sum, correct)
                    self._share_state()
                # the epoch's values, queued on the device and read back together (on the GPU one
                # transfer, not one wait per value): its sums, the penalty (once per epoch: validation
                # adds the same), the guard's sum over the weights, and the validation's sums
                if callbacks or val is not None:  # others see the model: plain mode
                    fast = self.fast_mode(False)
                queued = [loss_sum, correct if classify else None, self._penalty() if regularized else 0.0,
                          guard.total(), self._sums]
                if val is not None:
                    queued += self._evaluate_sums(*val, sharded=True)
                got = backend.read_back(queued)
                penalty = got[2]
                train_loss = got[0] / used + penalty  # the loss reported, as checked
                if not guard.healthy(train_loss, got[3]):  # replay the epoch to name the first non-finite value
                    fast = self.fast_mode(False)
                    error = guard.diagnose(epoch, self._epoch_batches(xd, yd, order_d, bs, used, first, parts),
                                           after_backward, first)
                    self.position = guard.position  # the state kept: where the epoch started or resumed
                    raise error
                self.epoch = epoch
                m = self._validation(got[5:], len(val[0]), penalty) if val is not None else _NO_VALIDATION
                row = {"epoch": epoch, "train_loss": train_loss,
                       "train_accuracy": got[1] / used if classify else None,
                       "val_loss": m["loss"], "val_accuracy": m["accuracy"],
                       "learning_rate": float(optimizer.learning_rate),
                       "seconds": time.perf_counter() - t0}
                if tracked:
                    row.update(self.tracker.values(got[4], "train_"))
                    row.update(self.tracker.values(m.get("metrics"), "val_"))
                history.rows.append(row)
                if self._draws:  # (before the callbacks: the checkpoint writer among them)
                    self._gather_states()
                stop = False
                for cb in callbacks:
                    stop = bool(cb.on_epoch_end(epoch, row)) or stop
                in_batches = False
                if stop:
                    break
        except Interrupted as e:
            if not e.immediate and done and self.epoch < epoch:  # stopped between two batches of ``epoch``
                shares = ()
                if world is not None:  # every rank stopped after the same batch: the sums so far, over them
                    shares = self._gather_sums(loss_sum, correct)  # (each rank's own: a resume on as many continues them)
                    loss_sum, correct = self._sum_over_ranks(loss_sum, correct)
                # where a checkpoint continues from (the epoch's start when the state there is not finite)
                self.position = guard.kept(EpochPosition(epoch, done, batches, n, bs, shuffle_state, float(loss_sum),
                                                         int(correct), time.perf_counter() - t0,
                                                         *(self.tracker.position(self._sums) or ((), ())), shares))
                if self._draws:  # (the states the position stands at: the epoch's start when it was undone)
                    self._gather_states()
            raise
        except BaseException as e:  # code raised inside an epoch: back to where it started (or resumed)
            if in_batches and not isinstance(e, NonFiniteError):  # (the replay has put its state back)
                self.position = guard.restore(rewind_shuffle=True)
                self.epoch = epoch - 1  # (raised in its validation or callbacks: the epoch is not recorded)
            raise
        finally:
            if fast:
                self.fast_mode(False)
        for cb in callbacks:
            cb.on_train_end(history.rows)
        return history

    def epoch_batches(self, n: int) -> tuple[int, int]:
        """(batch size, batches per epoch) for ``n`` training samples. A batch_size above ``n``
        trains on all ``n``; with drop_last, a last batch smaller than the others is skipped."""
        bs = n if self.batch_size is None else min(self.batch_size, n)
        return bs, (n // bs if self.drop_last else math.ceil(n / bs))

    def train_step(self, xb, yb, callbacks=(), window=None):
        """One optimisation step on a device batch, adding to the epoch's metric sums (see
        :class:`~dlrun.training.step.TrainingStep`); returns ``(batch loss × batch size, number of correct
        predictions)`` as device scalars."""
        return self.training_step(xb, yb, callbacks, window, self._sums)

    def _epoch_batches(self, xd, yd, order_d, bs: int, used: int, first: int = 0, parts=None):
        """The batches of one epoch from batch ``first`` on, in the order ``fit`` drew them, each
        with its accumulation window or None, and this rank's fraction of it (None: one process),
        for the non-finite replay."""
        batches = -(-used // bs)
        plan = windows(batches, bs, used, self.accumulate, first) if self.accumulate > 1 else None
        for b, s in enumerate(range(first * bs, used, bs)):
            part, share = (slice(0, bs), None) if parts is None else parts[first + b]
            idx = slice(s + part.start, min(s + part.stop, used))
            idx = idx if order_d is None else order_d[idx]
            yield xd[idx], yd[idx], plan[b] if plan else None, share

    def _gather_sums(self, loss_sum, correct) -> tuple:
        """Each rank's loss, correct-prediction and metric sums, in rank order, on rank 0 (() on the
        others; one collective)."""
        sums = self._sums
        mine = [float(loss_sum), float(correct), *(self.backend.to_host(sums).tolist() if sums is not None else [])]
        return tuple(self.world.gather(mine) or ())

    def _sum_over_ranks(self, loss_sum, correct):
        """The loss, correct-prediction and metric sums of every rank's part, added up (one
        collective); the metric sums replace ``self._sums``."""
        sums = self._sums
        values = np.concatenate([[float(loss_sum), float(correct)],
                                 self.backend.to_host(sums) if sums is not None else []])
        total = self.world.sum_host(values)
        if sums is not None:
            self._sums = self.backend.asarray(total[2:])
        return self.backend.xp.float64(total[0]), self.backend.xp.int64(round(total[1]))

    def _gather_states(self) -> None:
        """Every rank's layer generator states, in rank order, into ``rank_states`` on rank 0
        (one collective)."""
        self.rank_states = self.world.gather(seeding.layer_states(self.model.layers))

    def _share_state(self) -> None:
        """Rank 0's layer state (per-rank running statistics) on every rank, as PyTorch DDP
        broadcasts its buffers: evaluation and checkpoints then see one model."""
        arrays = [getattr(layer, a) for layer in self.model.layers for a in layer.state]
        arrays = [a for a in arrays if hasattr(a, "shape") and hasattr(a, "dtype")]
        if arrays:
            self.world.broadcast(arrays)

    def _batches(self, n: int, batch_size: int | None):
        bs = n if batch_size is None else max(1, min(batch_size, n))
        return [(s, min(s + bs, n)) for s in range(0, n, bs)]

    def _evaluate_sums(self, xd, yd, batch_size: int | None = None, sharded: bool = False) -> list:
        """Queue the evaluation of (xd, yd) in evaluation mode: ``[loss sum, correct predictions
        (None for regression), metric sums]``, on the device (several ranks: this rank's part,
        added up over the ranks, on the host)."""
        self.model.eval()
        n = len(xd)
        # several ranks: this rank's part (rows lo..hi), whose sums are added up below
        part = self.world.part(n) if sharded and self.world is not None else slice(0, n)
        loss_sum, correct = self.backend.zero(np.float64), self.backend.zero(np.int64)
        sums = self.tracker.zeros()
        for s, e in self._batches(part.stop - part.start, batch_size or self.batch_size or n):
            s, e = s + part.start, e + part.start
            batch_loss, batch_correct = self.training_step.evaluate(xd[s:e], yd[s:e], sums)
            loss_sum += batch_loss
            if self.classification:
                correct += batch_correct
        self.model.train()
        if sharded and self.world is not None:
            values = np.concatenate([[float(loss_sum), float(correct)],
                                     self.backend.to_host(sums) if sums is not None else []])
            total = self.world.sum_host(values)
            loss_sum, correct = total[0], round(total[1])
            sums = total[2:] if sums is not None else None
        return [loss_sum, correct if self.classification else None, sums]

    def _validation(self, got: list, n: int, penalty: float) -> dict:
        """Loss (with ``penalty``), accuracy and metric sums from :meth:`_evaluate_sums`' values
        read back, for ``n`` samples."""
        loss_sum, correct, sums = got
        return {"loss": loss_sum / n + penalty, "accuracy": correct / n if self.classification else None,
                "metrics": sums}

    def _evaluate_device(self, xd, yd, batch_size: int | None = None) -> dict:
        """Loss, accuracy and metric sums (host values, read back at once) on device data."""
        queued = [self._penalty() if self.training_step.regularized else 0.0,
                  *self._evaluate_sums(xd, yd, batch_size)]
        got = self.backend.read_back(queued)
        return self._validation(got[1:], len(xd), got[0])

    def evaluate(self, x, y, batch_size: int | None = None) -> dict:
        """Loss (including regularization), accuracy and the train.metrics (``metrics``: name to
        value) on (x, y), in evaluation mode."""
        m = self._evaluate_device(*self.to_device(x, y), batch_size)
        return {**m, "metrics": self.tracker.values(m["metrics"], "")}

    def predict(self, x, batch_size: int | None = None) -> np.ndarray:
        """Raw model outputs for ``x`` (host array), in evaluation mode."""
        return predict(self.model, x, batch_size or self.batch_size)


def _so_far(start: EpochPosition | None, world) -> tuple | None:
    """(loss sum, correct predictions, metric sums) of a resumed epoch's batches done that this
    rank continues from, or None. Several ranks: each its own share when the position holds one
    per rank (it stopped on as many: the epoch's sums then add up in the order of a run that never
    stopped); else rank 0 holds the whole sums and the others start from nothing."""
    if start is None:
        return None
    if world is not None and len(start.rank_sums) == world.size:
        mine = start.rank_sums[world.rank]
        return mine[0], round(mine[1]), mine[2:] if start.metrics else None
    if world is not None and world.rank != 0:
        return None
    return start.loss_sum, start.correct, start.metric_sums if start.metrics else None


def _parts(world, bs: int, used: int, batches: int) -> list[tuple[slice, float]]:
    """For each batch of an epoch (``bs`` samples, the last what is left of ``used``): this
    rank's slice of it and the fraction of the batch that slice is."""
    out = []
    for b in range(batches):
        size = min(bs, used - b * bs)
        p = world.part(size)
        out.append((p, (p.stop - p.start) / size))
    return out


def predict(model: Sequential, x, batch_size: int | None = None) -> np.ndarray:
    """Raw outputs of ``model`` for host array ``x`` (see :meth:`Sequential.predict`)."""
    return model.predict(x, batch_size)


class MappedBatches:
    """Features memory-mapped from a file (:class:`~dlrun.data.mapped.Rows`) where the trainer
    would hold them on the device: ``xd[idx]`` reads rows ``idx`` from the file and moves them,
    so that one batch at a time is in memory."""

    def __init__(self, rows: Rows, move, to_host):
        self.rows, self.move, self.to_host = rows, move, to_host

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx):
        return self.move(self.rows[idx if isinstance(idx, slice) else self.to_host(idx)])


# what Trainer.state_dict gives, by key
_STATE = {
    "epoch": lambda t: t.epoch,
    "step": lambda t: t.training_step.count,
    "position": lambda t: t.position,
    "shuffle": lambda t: t.shuffle_rng.bit_generator.state,
    "optimizer": lambda t: t.optimizer.state_dict() if hasattr(t.optimizer, "state_dict") else {},
    "learning_rate": lambda t: t.optimizer.learning_rate,
    "controls": lambda t: control_states(t.controls),
}
