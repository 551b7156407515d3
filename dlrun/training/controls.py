"""Training controls from the ``train:`` section, as :class:`~dlrun.training.hooks.Callback` objects.

* :class:`GradientClipping` (``clip_value``, ``clip_norm``) acts after backward, before the
  optimizer steps;
* :class:`LearningRateScheduler` (``schedule``) sets the optimizer's rate before each epoch;
* :class:`EarlyStopping` (``early_stopping``) stops training when a metric stops improving.

:func:`from_config` builds the ones a config asks for and checks their monitored metrics exist.
"""
from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from .. import registry
from ..backend import array_module
from ..errors import ConfigError, ContractError
from ..metrics.monitor import check as check_monitor, improved, resolve_mode
from ..schedules import Schedule
from .hooks import Callback, Event


class GradientClipping(Callback):
    """Clip gradients in place: by value g ← clip(g, −c, c), then by global norm g ← g·min(1, c/(‖g‖ + 1e-6)).

    ‖g‖ is the L2 norm over all trainable parameters' gradients together (as
    torch.nn.utils.clip_grad_norm_); the factor is computed on the device, so no per-step sync.

    Args:
        clip_norm: the largest global norm; null turns norm clipping off.
        clip_value: the largest absolute gradient entry; null turns value clipping off.
    """

    capturable = True  # device work alone, with constant arguments: a CUDA graph may record it

    def __init__(self, clip_norm: float | None = None, clip_value: float | None = None):
        self.clip_norm, self.clip_value = clip_norm, clip_value
        self.last_norm = None  # the global norm before norm clipping, as a device scalar

    def on_train_begin(self, trainer):
        self.grads = [p.grad for _, p in trainer.optimizer.params]
        # a gradient's squared norm g·g: numpy's vdot on the CPU; on the GPU the backend's product
        # (1 x n by n x 1), which a captured step can take, where CuPy's vdot is refused
        b = trainer.backend
        self._dot = np.vdot if b.xp is np else b.matmul

    def on_after_backward(self, trainer):
        if not self.grads:
            return
        xp = array_module(self.grads[0])
        if self.clip_value is not None:
            for g in self.grads:
                xp.clip(g, -self.clip_value, self.clip_value, out=g)
        if self.clip_norm is not None:
            dot = self._dot
            total = sum(dot(flat, flat) for flat in (g.ravel() for g in self.grads))
            self.last_norm = xp.sqrt(total)
            scale = xp.minimum(self.clip_norm / (1e-6 + self.last_norm), 1.0)
            for g in self.grads:
                g *= scale


class LearningRateScheduler(Callback):
    """Sets ``optimizer.learning_rate`` from the schedule before each epoch, or before every step.

    The schedule's base rate lr₀ is the optimizer's learning rate when training begins.

    Args:
        schedule: a :class:`~dlrun.schedules.Schedule`.
        epochs: the number of epochs the run trains (what cosine anneals over by default).
        interval: "epoch" (``schedule.value(epoch)`` for the whole epoch) or "step"
            (``schedule.at(u, 1/B)`` before each of the epoch's B steps, u the epochs done).
    """

    def __init__(self, schedule: Schedule, epochs: int, interval: str = "epoch"):
        self.schedule, self.epochs, self.interval = schedule, epochs, interval
        self.every = 1  # batches per step, from the trainer
        self.base_lr = None
        self._restored = None

    def on_train_begin(self, trainer):
        self.trainer = trainer
        self.optimizer = trainer.optimizer
        self.every = getattr(trainer, "accumulate", 1)  # batches per step (gradient accumulation)
        if self.base_lr is None or self._restored is not None:
            # lr₀ as configured; on --resume the recorded one unless --set changed it. A second
            # fit in the same process keeps the first one's (the optimizer holds a scheduled rate)
            self.base_lr = float(self.optimizer.learning_rate)
        self.schedule.start(self.base_lr, self.epochs)
        if self._restored is not None:
            self.schedule.load_state_dict(self._restored)
            self._restored = None

    def state_dict(self) -> dict:
        """lr₀ and the schedule's state."""
        return {"base_lr": self.base_lr, "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self._restored = state["schedule"]

    def on_epoch_begin(self, epoch, batches):
        self.batches = batches
        if self.interval == "epoch":
            self._set(self.schedule.value(epoch), epoch)
        else:
            self._step_rate(epoch, 0)

    def on_epoch_resume(self, epoch, batches_done):
        if self.interval == "step" and batches_done < self.batches:
            self._step_rate(epoch, batches_done)

    def on_batch_end(self, epoch, batch):
        if self.interval == "step" and batch < self.batches and batch % self.every == 0:  # a step starts
            self._step_rate(epoch, batch)

    def _step_rate(self, epoch: int, batch: int) -> None:
        """The rate of the step whose batches start at ``batch`` (one batch, or the window of
        accumulated batches up to the next multiple of ``every``). Positions count optimizer
        steps, k of the epoch's S = ceil(B / every): the steps of a run whose batches are
        ``every`` times larger, even when the last window is short (S steps of length 1/S)."""
        steps = -(-self.batches // self.every)
        k = batch // self.every
        self._set(self.schedule.at(epoch - 1 + k / steps, 1.0 / steps), epoch, k + 1)

    def _set(self, rate, epoch: int, step: int = 1) -> None:
        """Give the optimizer ``rate``: a finite number >= 0 (a plugin schedule's negative rate
        would climb the loss, silently), else a ContractError naming the schedule."""
        r = float(rate)
        if not 0.0 <= r < math.inf:
            at = f"step {step} of epoch {epoch}" if self.interval == "step" else f"epoch {epoch}"
            raise ContractError(f"the schedule {self.schedule!r} gave the learning rate {r!r} for {at}; a rate "
                                f"must be a finite number >= 0")
        self.optimizer.learning_rate = r

    def on_epoch_end(self, epoch, metrics):
        if self.schedule.monitor is None:  # a function of the epoch: nothing to announce
            self.schedule.observe(epoch, metrics)
            return
        before = self._next_rate(epoch)
        self.schedule.observe(epoch, metrics)
        after = self._next_rate(epoch)
        if after != before:  # what the metric did to the rate (a reduction on a plateau)
            self.trainer.announce(Event("learning_rate", epoch, monitor=self.schedule.monitor, old_rate=before,
                                        new_rate=after, source=getattr(self.schedule, "registered_name",
                                                                       type(self.schedule).__name__)))

    def _next_rate(self, epoch: int) -> float:
        """The rate the schedule gives the first step after ``epoch``."""
        if self.interval == "epoch":
            return float(self.schedule.value(epoch + 1))
        return float(self.schedule.at(float(epoch), 1.0 / -(-self.batches // self.every)))


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by more than min_delta for ``patience`` epochs.

    Options as :class:`dlrun.config.settings.EarlyStoppingSettings`. After the run, ``best_epoch``,
    ``best`` and ``stopped_epoch`` (None when training ran to the end) tell what happened.
    """

    def __init__(self, monitor: str = "val_loss", patience: int = 5, min_delta: float = 0.0,
                 mode: str = "auto", restore_best_weights: bool = False):
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.mode, self.restore_best_weights = resolve_mode(mode, monitor), restore_best_weights
        self._restored = self._offered = None

    def on_train_begin(self, trainer):
        self.trainer, self.model = trainer, trainer.model
        self.best = self.best_epoch = self.stopped_epoch = self.best_weights = None
        self.wait = 0
        self.last_epoch = None
        if self._restored is not None:  # a resumed run: the counters go on where they stopped
            self.best, self.best_epoch, self.wait = (self._restored[k] for k in ("best", "best_epoch", "wait"))
            self._restored = None
            if self._offered is not None and self._offered[0] == self.best_epoch:
                self.best_weights = self._offered[1]
        self._offered = None

    def state_dict(self) -> dict:
        """The best value, its epoch and the epochs waited since. The best weights are not part
        of it: after a resume they come from the run's best.npz (see :meth:`offer_best_weights`)."""
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state: dict) -> None:
        self._restored = dict(state)

    def offer_best_weights(self, epoch: int, arrays: dict) -> None:
        """Weights (``state_arrays`` form) recorded elsewhere for ``epoch``, such as the run's
        best.npz. A resumed run takes them as its best weights when ``epoch`` is the restored
        best epoch, so ``restore_best_weights`` works across a resume."""
        self._offered = (epoch, arrays)

    def on_epoch_end(self, epoch, metrics):
        current = metrics[self.monitor]
        self.last_epoch = epoch
        if self.best is None or improved(current, self.best, self.mode, self.min_delta):
            self.best, self.best_epoch, self.wait = current, epoch, 0
            if self.restore_best_weights:
                # copies on the model's device (on the GPU the host waits for none of them)
                self.best_weights = {k: v.copy() if hasattr(v, "copy") else np.asarray(v)
                                     for k, v in self.model.device_state().items()}
            return False
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            self.trainer.announce(Event("early_stopping", epoch, monitor=self.monitor, value=self.best,
                                        best_epoch=self.best_epoch, waited=self.wait))
            return True
        return False

    restore_at_end = True  # dlrun train sets False and calls restore_best() after the last checkpoint

    def on_train_end(self, history):
        if self.restore_at_end:
            self.restore_best()

    def restore_best(self) -> None:
        """Load the best weights back (with ``restore_best_weights``, when the last epoch was not the best)."""
        if self.restore_best_weights and self.best_weights is not None and self.best_epoch != self.last_epoch:
            self.model.load_state_arrays(self.best_weights)
            self.trainer.announce(Event("restored_best", self.last_epoch, monitor=self.monitor, value=self.best,
                                        best_epoch=self.best_epoch))


def control_states(controls) -> list[dict]:
    """``[{"type": name, "state": {...}}]`` for the controls that keep state (checkpoint meta)."""
    return [{"type": type(c).__name__, "state": c.state_dict()} for c in controls if hasattr(c, "state_dict")]


def load_control_states(controls, states: list[dict]) -> None:
    """Give each stateful control the state a checkpoint recorded for the control of its type
    (controls the config no longer asks for are ignored; new ones start fresh)."""
    by_type = {s["type"]: s["state"] for s in states or ()}
    for c in controls:
        if hasattr(c, "load_state_dict") and type(c).__name__ in by_type:
            c.load_state_dict(by_type[type(c).__name__])


def from_config(config, has_validation: bool, classification: bool, metrics: dict | None = None) -> list[Callback]:
    """The callbacks ``config.train`` asks for: clipping, schedule, early stopping (in that order);
    ``metrics``: the train.metrics the run records, which they may monitor (name: mode)."""
    metrics = metrics or {}
    t, out = config.train, []
    if t.clip_norm is not None or t.clip_value is not None:
        out.append(GradientClipping(t.clip_norm, t.clip_value))
    if t.schedule is not None:
        schedule = registry.schedules.build(t.schedule, "train.schedule", config.locate)
        if schedule.monitor is not None:
            check_monitor(schedule.monitor, "train.schedule.monitor", has_validation, classification,
                          config.locate, tuple(metrics))
            if (getattr(schedule, "spec", None) or {}).get("mode", "auto") == "auto":  # a named metric's own mode
                schedule.mode = resolve_mode("auto", schedule.monitor, metrics)
        if t.schedule_interval == "step" and not schedule.per_step():
            raise ConfigError(f"schedule {schedule!r} defines a rate per epoch only (value), not per step (at); "
                              f"set train.schedule_interval: epoch", config.locate("train.schedule_interval"))
        out.append(LearningRateScheduler(schedule, t.epochs, t.schedule_interval))
    if t.early_stopping is not None:
        check_monitor(t.early_stopping.monitor, "train.early_stopping.monitor", has_validation, classification,
                      config.locate, tuple(metrics))
        stopping = asdict(t.early_stopping)
        stopping["mode"] = resolve_mode(stopping["mode"], stopping["monitor"], metrics)
        out.append(EarlyStopping(**stopping))
    return out
