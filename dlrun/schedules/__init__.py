"""Learning-rate schedules, configured as ``train.schedule`` and applied once per epoch, or before
every step with ``train.schedule_interval: step``.

A schedule maps the training position to the learning rate, relative to the optimizer's
configured ``learning_rate`` (the base rate lr₀). ``at(u, delta)`` is the rate of a step that
starts after u epochs (fractional) and lasts delta epochs: per epoch, epoch e is u = e − 1,
delta = 1 (``value(e)``); per step, step b (from 0) of B in epoch e is u = e − 1 + b/B,
delta = 1/B. The trainer callback :class:`dlrun.training.controls.LearningRateScheduler` sets it; the
rate of each epoch's last step is written to metrics.csv (``learning_rate``). Positions are
absolute, so a resumed run continues the schedule where it stopped.
"""

from .base import Mode, Monitor, Schedule
from . import decay, warmup, plateau, onecycle  # noqa: F401  (registration side effects)

__all__ = ["Schedule", "Monitor", "Mode"]
