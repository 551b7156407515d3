"""The schedule contract (:class:`Schedule`) and the option types of schedules that watch a
metric (the metric and its direction are :mod:`dlrun.metrics.monitor`'s)."""
from __future__ import annotations

from typing import Annotated, Literal

from ..registry.options import Range
from ..registry import schedules

Monitor = str  # train_loss, val_accuracy, val_mae, ...: checked against the run's metrics (dlrun.metrics.monitor.check)
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
