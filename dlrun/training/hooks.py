"""What :meth:`dlrun.training.trainer.Trainer.fit` calls back, and the history it returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .trainer import Trainer


class Callback:
    """Hooks called by :meth:`Trainer.fit`. Return True from ``on_epoch_end`` to stop."""

    def on_train_begin(self, trainer: "Trainer") -> None: ...
    def on_epoch_begin(self, epoch: int, batches: int) -> None: ...
    def on_epoch_resume(self, epoch: int, batches_done: int) -> None:
        """After ``on_epoch_begin``, when a resumed run continues ``epoch`` after its first
        ``batches_done`` batches (see :mod:`dlrun.training.position`)."""

    def on_after_backward(self, trainer: "Trainer") -> None:
        """Gradients are written (regularization included); the optimizer steps next. With
        gradient accumulation: once per step, on the window's accumulated gradients."""

    def on_batch_end(self, epoch: int, batch: int) -> None:
        """After every batch (``batch`` of the epoch's, from 1), whether or not the optimizer stepped."""

    def on_epoch_end(self, epoch: int, metrics: dict) -> bool | None: ...
    def on_train_end(self, history: list[dict]) -> None: ...

    def on_event(self, event: "Event") -> None:
        """A training control acted (see :class:`Event`); during an epoch's ``on_epoch_end`` calls
        (the control comes before the display in the list) or, for a restore, after training."""


def listening(callbacks, hook: str) -> list:
    """The callbacks whose ``hook`` (a :class:`Callback` method name) does something: those that
    override the base class's, which does nothing. Per-batch hooks are called on these alone."""
    base = getattr(Callback, hook)
    return [cb for cb in callbacks if getattr(getattr(cb, hook, None), "__func__", None) is not base]


@dataclass(frozen=True)
class Event:
    """What a training control did, as data for whoever reports it (``dlrun train`` prints one
    line each; the library prints nothing).

    ``kind`` is one of:

    * ``"early_stopping"``: training stops after ``epoch``; ``monitor`` has not improved for
      ``waited`` epochs, its best ``value`` was at ``best_epoch``.
    * ``"restored_best"``: the weights of ``best_epoch`` (``monitor`` at its best, ``value``)
      were put back after the last epoch, ``epoch``.
    * ``"learning_rate"``: after ``epoch``, the schedule ``source`` (which watches ``monitor``)
      changed the rate of the next epoch from ``old_rate`` to ``new_rate``.
    """

    kind: str
    epoch: int
    monitor: str | None = None
    value: float | None = None
    best_epoch: int | None = None
    waited: int | None = None
    old_rate: float | None = None
    new_rate: float | None = None
    source: str | None = None


@dataclass
class History:
    rows: list[dict] = field(default_factory=list)

    @property
    def last(self) -> dict:
        return self.rows[-1] if self.rows else {}
