"""reduce_on_plateau: a rate that follows a monitored metric (Keras' ReduceLROnPlateau)."""
from __future__ import annotations

from ..registry.options import NonNegativeFloat, NonNegativeInt
from ..registry import schedules
from ..metrics.monitor import improved, resolve_mode
from .base import Factor, Mode, Monitor, Schedule


@schedules.register("reduce_on_plateau")
class ReduceOnPlateau(Schedule):
    """lr ← max(lr · factor, min_lr) after ``patience`` epochs without improvement of ``monitor``.

    An epoch improves when the metric beats the best so far by more than min_delta (lower for
    min mode, higher for max mode). After a reduction the counter restarts, and ``cooldown``
    epochs pass before epochs without improvement count again. As Keras' ReduceLROnPlateau.

    Args:
        monitor: the metric to watch: train_loss, val_loss, train_accuracy, val_accuracy, or
            train_NAME / val_NAME for a metric of train.metrics (val_* needs validation data).
        factor: the multiplier applied at each reduction, in (0, 1).
        patience: epochs without improvement before the rate is reduced.
        min_delta: the smallest change that counts as an improvement.
        mode: min (losses), max (accuracies) or auto (the metric's own: max for accuracies, F1
            and R², min for losses and errors).
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
