"""Linear warm-up, optionally followed by another schedule."""
from __future__ import annotations

from typing import Annotated

from ..registry.options import PositiveInt, Range
from ..registry import schedules
from .base import Schedule


@schedules.register("warmup")
class LinearWarmup(Schedule):
    """lr = lr₀ · (start_factor + (1 − start_factor) · epoch / W) for epoch ≤ W, then the ``then`` schedule.

    Linear warm-up over the first W epochs, reaching lr₀ in epoch W; from epoch W + 1 on, the
    wrapped schedule runs as if training had started then (its epoch 1 is epoch W + 1 and it
    spans train.epochs − W epochs). Without ``then`` the rate stays at lr₀.

    Each warm-up epoch (or step) gets the line's value at its end, so epoch 1 already runs one
    step above start_factor · lr₀. PyTorch's LinearLR and Keras' warm-up take the value at its
    start: lr₀ · (start_factor + (1 − start_factor) · (epoch − 1) / W), epoch 1 at
    start_factor · lr₀ and lr₀ only in epoch W + 1, where ``then`` starts (start_factor 0.25,
    W = 4: 0.25, 0.4375, 0.625, 0.8125 × lr₀ there, 0.4375, 0.625, 0.8125, 1.0 here). With
    ``begin_at_start_factor: true`` the rates are PyTorch's: LinearLR(start_factor,
    total_iters=W) followed by ``then`` through SequentialLR(milestones=[W]); per step, W·B for
    both, B the steps of an epoch.

    Args:
        epochs: W, the number of warm-up epochs.
        start_factor: where the line starts, as a fraction of lr₀ (at "epoch 0").
        then: the schedule after the warm-up, e.g. {type: cosine}; null keeps lr₀.
        begin_at_start_factor: true: run the first warm-up epoch (or step) at
            start_factor · lr₀ and reach lr₀ in epoch W + 1, as PyTorch's LinearLR; false: reach
            lr₀ in epoch W. With start_factor 0, true makes the first epoch (or step) rate 0.
    """

    def __init__(self, epochs: PositiveInt = 5, start_factor: Annotated[float, Range(0, 1)] = 0.0,
                 then: Schedule | None = None, begin_at_start_factor: bool = False):
        self.warmup, self.start_factor, self.then = epochs, start_factor, then
        self.begin_at_start_factor = begin_at_start_factor
        self.monitor = then.monitor if then is not None else None

    def start(self, base_lr, epochs):
        super().start(base_lr, epochs)
        if self.then is not None:
            self.then.start(base_lr, max(epochs - self.warmup, 1))

    def at(self, u, delta):
        if self.begin_at_start_factor:  # the line at the step's start: lr₀ is first reached by ``then``
            done, rising = u, u < self.warmup - 1e-9
        else:  # epochs done after this step: the line reaches lr₀ with the W-th epoch's last step
            done = u + delta
            rising = done <= self.warmup + 1e-9
        if rising:
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
