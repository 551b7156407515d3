"""Schedules that are functions of the position alone: step, multistep, exponential, cosine."""
from __future__ import annotations

import math

from ..registry.options import NonNegativeFloat, OptionError, PositiveFloat, PositiveInt
from ..registry import schedules
from .base import Schedule


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


@schedules.register("multistep")
class MultiStepDecay(Schedule):
    """lr = lr₀ · gamma^m, m the number of milestones ≤ epoch − 1: multiply by gamma once each milestone epoch is done.

    PyTorch's MultiStepLR: milestones [30, 80] give lr₀ in epochs 1–30, lr₀·γ in epochs 31–80
    and lr₀·γ² from epoch 81 on.

    Args:
        milestones: strictly increasing epoch numbers after which the rate drops.
        gamma: the factor applied at each milestone.
    """

    def __init__(self, milestones: list[PositiveInt], gamma: PositiveFloat = 0.1):
        milestones = [int(m) for m in milestones]
        if not milestones or any(b <= a for a, b in zip(milestones, milestones[1:])):
            raise OptionError(f"milestones must be a non-empty, strictly increasing list of epochs, got {milestones}",
                              "milestones")
        self.milestones, self.gamma = milestones, gamma

    def at(self, u, delta):
        passed = sum(1 for m in self.milestones if u + 1e-9 >= m)  # at epoch starts, as step
        return self.base_lr * self.gamma ** passed


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
