"""Learning-rate schedules, configured as ``train.schedule`` and applied once per epoch, or before
every step with ``train.schedule_interval: step``.

A schedule maps the training position to the learning rate, relative to the optimizer's
configured ``learning_rate`` (the base rate lr₀). ``at(u, delta)`` is the rate of a step that
starts after u epochs (fractional) and lasts delta epochs: per epoch, epoch e is u = e − 1,
delta = 1 (``value(e)``); per step, step b (from 0) of B in epoch e is u = e − 1 + b/B,
delta = 1/B. The trainer callback :class:`dlrun.callbacks.LearningRateScheduler` sets it; the
rate of each epoch's last step is written to metrics.csv (``learning_rate``). Positions are
absolute, so a resumed run continues the schedule where it stopped.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

from .options import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, Range
from .registry import schedules

Monitor = Literal["val_loss", "val_accuracy", "train_loss", "train_accuracy"]
Mode = Literal["auto", "min", "max"]
Factor = Annotated[float, Range(0, 1, min_inclusive=False, max_inclusive=False)]  # (0, 1)


class Schedule:
    """Base class: ``at(u, delta)`` is the rate of a step starting after u epochs and lasting delta
    epochs; ``value(epoch)`` the rate of the whole 1-based ``epoch``. A schedule defines ``at``
    (then both work) or only ``value`` (then it runs per epoch only)."""

    monitor: str | None = None  # the metric a schedule reads in ``observe`` (checked before training)

    def start(self, base_lr: float, epochs: int) -> None:
        """Called once before training with lr₀ and the number of epochs the schedule spans."""
        self.base_lr, self.epochs = float(base_lr), int(epochs)

    def at(self, u: float, delta: float) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no per-step rate (at)")

    def value(self, epoch: int) -> float:
        return self.at(epoch - 1, 1.0)

    def per_step(self) -> bool:
        """Whether the schedule has a per-step form (defines ``at``)."""
        return type(self).at is not Schedule.at

    def observe(self, epoch: int, metrics: dict) -> None:
        """Called after each epoch with its metrics row (only reduce_on_plateau uses it)."""

    def state_dict(self) -> dict:
        """What ``observe`` has learnt, as JSON values, for checkpoints (nothing for pure functions of the epoch)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output (called after :meth:`start`). On --resume the config
        may name another schedule than the checkpoint's: a state that does not fit is ignored."""

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None) or {}
        return f"{getattr(self, 'registered_name', type(self).__name__)}({', '.join(f'{k}={v!r}' for k, v in spec.items() if k != 'type')})"


schedules.base = Schedule


def resolve_mode(mode: str, monitor: str) -> str:
    """'auto' means max for accuracies and min for losses (as Keras)."""
    return mode if mode != "auto" else ("max" if "accuracy" in monitor else "min")


@schedules.register("step")
class StepDecay(Schedule):
    """lr = lr₀ · gamma^⌊(epoch − 1) / step_size⌋: multiply by gamma every step_size epochs.

    Args:
        step_size: epochs between two decays.
        gamma: the factor applied at each decay.
    """

    def __init__(self, step_size: PositiveInt = 10, gamma: PositiveFloat = 0.1):
        self.step_size, self.gamma = step_size, gamma

    def at(self, u, delta):
        return self.base_lr * self.gamma ** math.floor(u / self.step_size + 1e-9)  # at epoch starts


@schedules.register("exponential")
class ExponentialDecay(Schedule):
    """lr = lr₀ · gamma^(epoch − 1): multiply by gamma after every epoch.

    Args:
        gamma: the factor per epoch.
    """

    def __init__(self, gamma: PositiveFloat = 0.95):
        self.gamma = gamma

    def at(self, u, delta):
        return self.base_lr * self.gamma ** u


@schedules.register("cosine")
class CosineDecay(Schedule):
    """lr = min_lr + (lr₀ − min_lr) · (1 + cos(π · min(epoch − 1, T) / T)) / 2 (SGDR without restarts).

    Starts at lr₀ in epoch 1 and anneals to min_lr over T epochs, then stays at min_lr.

    Args:
        min_lr: the final learning rate.
        period: T, the epochs to anneal over; null means all the epochs the schedule spans
            (train.epochs, less the warm-up when wrapped in warmup).
    """

    def __init__(self, min_lr: NonNegativeFloat = 0.0, period: PositiveInt | None = None):
        self.min_lr, self.period = min_lr, period

    def at(self, u, delta):
        t = self.period or self.epochs
        frac = min(u, t) / t
        return self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * frac))


@schedules.register("warmup")
class LinearWarmup(Schedule):
    """lr = lr₀ · (start_factor + (1 − start_factor) · epoch / W) for epoch ≤ W, then the ``then`` schedule.

    Linear warm-up over the first W epochs, reaching lr₀ in epoch W; from epoch W + 1 on, the
    wrapped schedule runs as if training had started then (its epoch 1 is epoch W + 1 and it
    spans train.epochs − W epochs). Without ``then`` the rate stays at lr₀.

    Args:
        epochs: W, the number of warm-up epochs.
        start_factor: where the line starts, as a fraction of lr₀ (at "epoch 0").
        then: the schedule after the warm-up, e.g. {type: cosine}; null keeps lr₀.
    """

    def __init__(self, epochs: PositiveInt = 5, start_factor: Annotated[float, Range(0, 1)] = 0.0,
                 then: Schedule | None = None):
        self.warmup, self.start_factor, self.then = epochs, start_factor, then
        self.monitor = then.monitor if then is not None else None

    def start(self, base_lr, epochs):
        super().start(base_lr, epochs)
        if self.then is not None:
            self.then.start(base_lr, max(epochs - self.warmup, 1))

    def at(self, u, delta):
        done = u + delta  # epochs done after this step: the line reaches lr₀ with the W-th epoch's last step
        if done <= self.warmup + 1e-9:
            return self.base_lr * (self.start_factor + (1.0 - self.start_factor) * done / self.warmup)
        if self.then is None:
            return self.base_lr
        if self.then.per_step():
            return self.then.at(u - self.warmup, delta)
        return self.then.value(round(u) + 1 - self.warmup)  # a plugin schedule with value(epoch) only

    def per_step(self):
        return self.then is None or self.then.per_step()

    def observe(self, epoch, metrics):
        if self.then is not None and epoch > self.warmup:
            self.then.observe(epoch - self.warmup, metrics)

    def state_dict(self):
        return {"then": self.then.state_dict()} if self.then is not None else {}

    def load_state_dict(self, state):
        if self.then is not None and "then" in state:
            self.then.load_state_dict(state["then"])


@schedules.register("reduce_on_plateau")
class ReduceOnPlateau(Schedule):
    """lr ← max(lr · factor, min_lr) after ``patience`` epochs without improvement of ``monitor``.

    An epoch improves when the metric beats the best so far by more than min_delta (lower for
    min mode, higher for max mode). After a reduction the counter restarts, and ``cooldown``
    epochs pass before epochs without improvement count again. As Keras' ReduceLROnPlateau.

    Args:
        monitor: the metric to watch (val_* needs train.validation_split or validation data).
        factor: the multiplier applied at each reduction, in (0, 1).
        patience: epochs without improvement before the rate is reduced.
        min_delta: the smallest change that counts as an improvement.
        mode: min (losses), max (accuracies) or auto (max for *_accuracy, else min).
        cooldown: epochs to wait after a reduction before counting again.
        min_lr: the rate is never reduced below this.
    """

    def __init__(self, monitor: Monitor = "val_loss", factor: Factor = 0.1, patience: NonNegativeInt = 10,
                 min_delta: NonNegativeFloat = 1e-4, mode: Mode = "auto", cooldown: NonNegativeInt = 0,
                 min_lr: NonNegativeFloat = 0.0):
        self.monitor, self.factor, self.patience, self.min_delta = monitor, factor, patience, min_delta
        self.mode, self.cooldown, self.min_lr = resolve_mode(mode, monitor), cooldown, min_lr

    def start(self, base_lr, epochs):
        super().start(base_lr, epochs)
        self.lr, self.best, self.wait, self.cooling = self.base_lr, None, 0, 0

    def at(self, u, delta):
        return self.lr  # changes only between epochs (observe)

    def observe(self, epoch, metrics):
        current = metrics[self.monitor]
        if self.cooling > 0:
            self.cooling -= 1
            self.wait = 0
        if self.best is None or improved(current, self.best, self.mode, self.min_delta):
            self.best, self.wait = current, 0
        elif self.cooling == 0:
            self.wait += 1
            if self.wait >= self.patience and self.lr > self.min_lr:
                self.lr = max(self.lr * self.factor, self.min_lr)
                self.cooling, self.wait = self.cooldown, 0

    def state_dict(self):
        return {"lr": self.lr, "best": self.best, "wait": self.wait, "cooling": self.cooling, "base_lr": self.base_lr}

    def load_state_dict(self, state):
        if not {"lr", "best", "wait", "cooling"} <= set(state):  # another schedule's state: start afresh
            return
        # the reductions so far apply to lr₀ as configured now (--set optimizer.learning_rate on --resume)
        rescale = self.base_lr / state.get("base_lr", self.base_lr)
        self.lr = max(state["lr"] * rescale, self.min_lr)
        self.best, self.wait, self.cooling = state["best"], state["wait"], state["cooling"]


def improved(current: float, best: float, mode: str, min_delta: float) -> bool:
    """Whether ``current`` beats ``best`` by more than ``min_delta`` in direction ``mode``."""
    return current < best - min_delta if mode == "min" else current > best + min_delta


__all__ = ["Schedule", "Monitor", "Mode", "improved", "resolve_mode"]
