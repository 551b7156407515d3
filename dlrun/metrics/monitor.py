"""The monitored metric: the recorded column a run watches and the direction that is better.

Early stopping, ``reduce_on_plateau`` and the best checkpoint (``train.monitor``) each watch one
column of metrics.csv (``val_loss``, ``train_accuracy``, ``val_f1``, ...). This module owns what
that means: which names a run records, the direction of each (``mode: auto``: losses and errors
lower, accuracies, F1 and R² higher, a metric of ``train.metrics`` by its own ``mode``), the
improvement test, and which metric a run's best checkpoint follows (:func:`of_run`), resolved
once when the run is assembled.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import registry
from ..errors import ConfigError
from .base import metric_mode
from ..registry.options import did_you_mean


@dataclass(frozen=True)
class Monitor:
    """A metrics.csv column and whether lower (``"min"``) or higher (``"max"``) is better."""

    name: str
    mode: str

    def improved(self, current: float, best: float, min_delta: float = 0.0) -> bool:
        return improved(current, best, self.mode, min_delta)


def resolve_mode(mode: str, monitor: str, modes: dict | None = None) -> str:
    """'auto' means the metric's own direction: max for accuracies, F1 and R², min for losses and
    errors (as Keras); ``modes``: the run's metrics' by column name (a metric given a name)."""
    return mode if mode != "auto" else metric_mode(monitor, modes)


def improved(current: float, best: float, mode: str, min_delta: float) -> bool:
    """Whether ``current`` beats ``best`` by more than ``min_delta`` in direction ``mode``."""
    return current < best - min_delta if mode == "min" else current > best + min_delta


def check(monitor: str, path: str, has_validation: bool, classification: bool, locate,
          metrics: tuple[str, ...] = ()) -> None:
    """Raise a ConfigError when the run will not produce the metric ``monitor``: train_ or val_
    with loss, accuracy (classification) or a metric of train.metrics (``metrics``, their names)."""
    recorded = ("loss", "accuracy", *metrics) if classification else ("loss", *metrics)
    prefix, _, name = monitor.partition("_")
    if prefix == "val" and not has_validation:
        raise ConfigError(f"monitor {monitor!r} needs validation data; set train.validation_split "
                          f"(for example 0.2) or the file loader's data.validation_path, or monitor "
                          f"train_{name or 'loss'}", locate(path))
    if name == "accuracy" and not classification:
        raise ConfigError(f"monitor {monitor!r}: a regression loss gives no accuracy; monitor "
                          f"{monitor.replace('accuracy', 'loss')}", locate(path))
    if prefix in ("train", "val") and name in recorded:
        return
    if prefix in ("train", "val") and name in registry.metrics:
        raise ConfigError(f"monitor {monitor!r}: the run does not record {name}; add {name} to the list "
                          f"train.metrics", locate(path))
    names = [f"{p}_{n}" for p in ("train", "val") for n in recorded if p == "train" or has_validation]
    raise ConfigError(f"monitor {monitor!r} is not a metric the run records{did_you_mean(monitor, names)}; "
                      f"it records {', '.join(names)} (train_NAME and val_NAME for a metric of train.metrics)",
                      locate(path))


def config_errors(train, locate) -> list:
    """Monitors of a ``train:`` section that name no metric the run could record (loss, accuracy,
    train.metrics'), found with the rest of the config's errors; whether the data gives them is
    checked when the run is assembled."""
    listed = tuple(m if isinstance(m, str) else m.get("name", m.get("type")) if isinstance(m, dict) else None
                   for m in train.metrics or ())
    stopping = train.early_stopping.monitor if train.early_stopping is not None else None
    errors = []
    for path, monitor in (("train.monitor", train.monitor), ("train.early_stopping.monitor", stopping)):
        try:
            if monitor is not None:
                check(monitor, path, True, True, locate, tuple(n for n in listed if isinstance(n, str)))
        except ConfigError as e:
            errors.append(e)
    return errors


def resolve(monitor: str | None, has_val: bool, classification: bool, locate=None, mode: str = "auto",
            metrics: dict | None = None, path: str = "train.monitor") -> Monitor:
    """The :class:`Monitor` of ``monitor`` (unset: val_loss, or train_loss without validation
    data), checked: a ConfigError located by ``locate`` at ``path`` when the run will not produce
    it (``metrics``: train.metrics', name: mode)."""
    name = monitor or ("val_loss" if has_val else "train_loss")
    check(name, path, has_val, classification, locate or (lambda path: None), tuple(metrics or ()))
    return Monitor(name, resolve_mode(mode, name, metrics))


def of_run(config, has_val: bool, classification: bool, metrics: dict | None = None) -> Monitor:
    """What a run's best checkpoint follows: ``train.monitor``; unset, early stopping's (so that
    the weights restore_best_weights puts back are the ones saved), else val_loss or train_loss."""
    stopping = config.train.early_stopping
    if config.train.monitor is None and stopping is not None:
        return resolve(stopping.monitor, has_val, classification, config.locate, stopping.mode, metrics,
                       "train.early_stopping.monitor")
    return resolve(config.train.monitor, has_val, classification, config.locate, metrics=metrics)
