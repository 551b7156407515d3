"""The metric contract (:class:`Metric`) and :class:`Tracker`, which sums the metrics of
``train.metrics`` over an epoch's batches on the device and turns the sums into one value each.

A metric is a sum over samples, or a function of such sums: mean absolute error is Σ|z − y|
over the count, F1 a function of the confusion matrix's counts. ``update`` adds a batch's sums
into a float64 vector on the device (nothing is read back, so on GPU a step never waits for it),
and ``result`` computes the value from the epoch's sums, once, on the host. The value is thus the
metric of the whole epoch's samples, not a mean of batch values (for F1 or RMSE the two differ).
"""
from __future__ import annotations

import re

import numpy as np

from ..registry.docstrings import signature
from ..errors import ConfigError, ContractError, Location
from ..registry import metrics


class Metric:
    """Base class for epoch metrics; subclasses set ``task`` and ``mode`` and define ``size``,
    ``update`` and ``result``. Its name in metrics.csv is the registered name, with a train_
    and a val_ prefix."""

    task: str | None = None  # the loss task whose outputs it scores: "classification" or "regression"
    mode: str | None = None  # whether higher ("max") or lower ("min") is better: early stopping's mode auto
    recorded_always = False  # the trainer records it for every run of its task (accuracy)

    def setup(self, loss, outputs: int) -> str | None:
        """Called once before training with the loss and the model's outputs per sample; returns
        why the metric cannot score them, or None. Sets ``classes`` (classification)."""
        classes = getattr(loss, "classes", None)  # plugin losses need not define it
        self.classes = classes(outputs) if classes is not None else outputs
        self.outputs = outputs
        return None

    def size(self) -> int:
        """How many sums ``update`` adds to."""
        raise NotImplementedError

    def update(self, sums, z, y, loss) -> None:
        """Add the sums of the batch (outputs ``z``, labels or targets ``y``, both on the device)
        into ``sums``, a float64 vector of ``size()`` on the same device."""
        raise NotImplementedError

    def result(self, sums: np.ndarray) -> float | None:
        """The metric from an epoch's sums (a host float64 vector); None when no sample counted."""
        raise NotImplementedError

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None) or {}
        opts = ", ".join(f"{k}={v!r}" for k, v in spec.items() if k != "type")
        return f"{getattr(self, 'registered_name', type(self).__name__)}({opts})"


metrics.base = Metric

RESERVED = ("loss", "accuracy")  # train_loss, val_accuracy, ...: the columns every run has


def contract_problem(cls, registered: str) -> str | None:
    """Why a plugin metric class cannot be recorded, or None: it must implement size, update
    and result, declare task (classification or regression) and mode (min or max), and not take
    a name whose columns every run has."""
    missing = [m for m in ("size", "update", "result") if getattr(cls, m) is getattr(Metric, m)]
    if missing:
        return f"it does not implement {' and '.join(missing)}"
    if registered in RESERVED:
        return f"the name {registered!r} is taken: train_{registered} and val_{registered} are recorded for every run"
    if cls.task not in ("classification", "regression"):
        return f"set its task to 'classification' or 'regression' (a class attribute), got {cls.task!r}"
    if cls.mode not in ("min", "max"):
        return f"set its mode to 'min' (lower is better) or 'max' (a class attribute), got {cls.mode!r}"
    return None


metrics.check_entry = contract_problem  # what a plugin metric must define, checked when it loads


def predicted(loss, z):
    """The predicted class of each sample, as the loss decides it (argmax; BCE: z > 0)."""
    predict = getattr(loss, "predict", None)  # plugin losses need not define it
    return predict(z) if predict is not None else z.argmax(axis=1)


class Tracker:
    """The metrics of one run, their sums in one float64 vector on the device."""

    def __init__(self, chosen: list[Metric], backend):
        self.metrics = list(chosen)
        self.backend = backend
        self.slices, start = [], 0
        for m in self.metrics:
            size = m.size()
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
                raise ContractError(f"the metric {m!r}: size() returned {size!r}; expected a positive int, the "
                                    f"number of sums update adds to")
            self.slices.append(slice(start, start + int(size)))
            start += int(size)
        self.length = start
        self.names = tuple(name(m) for m in self.metrics)
        self.described = tuple(describe(m) for m in self.metrics)
        self.modes = {name(m): m.mode for m in self.metrics}

    def zeros(self, start=None):
        """A fresh vector of sums on the device (None without metrics); ``start`` (host values)
        continues an epoch."""
        if not self.metrics:
            return None
        if start is None:
            return self.backend.xp.zeros(self.length, dtype=np.float64)
        return self.backend.asarray(np.asarray(start, dtype=np.float64))

    def add(self, sums, z, y, loss) -> None:
        for m, s in zip(self.metrics, self.slices):
            m.update(sums[s], z, y, loss)

    def results(self, sums, prefix: str) -> dict[str, float | None]:
        """``{prefix + name: value}`` from an epoch's sums (read from the device once); every
        value None when ``sums`` is None (no validation data)."""
        return self.values(None if sums is None else self.backend.to_host(sums), prefix)

    def values(self, host, prefix: str) -> dict[str, float | None]:
        """:meth:`results` from sums already on the host (``Backend.read_back``'s, say)."""
        if host is None:
            return {prefix + n: None for n in self.names}
        host = np.asarray(host, dtype=np.float64)
        return {prefix + n: _value(m, m.result(host[s].copy()))
                for n, m, s in zip(self.names, self.metrics, self.slices)}

    def position(self, sums) -> tuple:
        """(the metrics with their options, their sums so far) for an
        :class:`~dlrun.training.position.EpochPosition`; () without metrics."""
        if sums is None:
            return ()
        return self.described, [float(v) for v in self.backend.to_host(sums)]


def _value(metric: Metric, v) -> float | None:
    """A metric's result as a float (None: no value), or a ContractError naming the metric."""
    if v is None:
        return None
    if getattr(v, "shape", ()) == () and not isinstance(v, (str, bytes, bool)):
        try:
            return float(v)
        except (TypeError, ValueError):
            pass
    shown = f"an array of shape {v.shape}" if getattr(v, "shape", ()) != () else repr(v)[:60]
    raise ContractError(f"the metric {metric!r}: result returned {shown}; expected a number (or None when no "
                        f"sample counted)")


def name(metric: Metric) -> str:
    """The name of a metric's columns: the entry's ``name``, else the registered name."""
    return getattr(metric, "column", None) or getattr(metric, "registered_name", type(metric).__name__)


_NAME = re.compile(r"[a-z][a-z0-9_]*")


def split_entry(spec, path: str, locate) -> tuple:
    """(the component spec, the entry's ``name`` or None) for a train.metrics entry: ``name``
    (Keras' name=) names the columns, so that one metric can be recorded with two options
    ({type: f1, average: weighted, name: f1_weighted}). A ConfigError for a name that could not
    be a column."""
    if not (isinstance(spec, dict) and "name" in spec):
        return spec, None
    column = spec["name"]
    if not (isinstance(column, str) and _NAME.fullmatch(column)) or column in RESERVED:
        why = (f"the name {column!r} is taken by the columns every run has" if column in RESERVED else
               f"expected a name of lower-case letters, digits and _ starting with a letter (it names the "
               f"columns train_NAME and val_NAME), got {column!r}")
        raise ConfigError(why, locate(f"{path}.name"))
    return {k: v for k, v in spec.items() if k != "name"}, column


def describe(metric: Metric) -> str:
    """'top_k_accuracy(k=5)': the name and every option's value, defaults included, so that two
    specs of one metric compare equal exactly when they compute the same thing."""
    spec = getattr(metric, "spec", None) or {}
    params = signature(type(metric)).parameters.values()
    return f"{name(metric)}({', '.join(f'{p.name}={spec.get(p.name, p.default)!r}' for p in params)})"


def build(specs, loss, outputs: int, locate=None) -> list[Metric]:
    """The metrics ``train.metrics`` lists, set up for the loss and the model's ``outputs``
    (ConfigErrors at ``train.metrics[i]``, placed by ``locate``): each once, each for the loss's
    task. Those the trainer records anyway (accuracy) are checked and left out."""
    locate = locate or (lambda path: Location(path=path))
    task = getattr(loss, "task", "classification")
    chosen, seen = [], {}
    for i, entry in enumerate(specs or ()):
        path = f"train.metrics[{i}]"
        spec, column = split_entry(entry, path, locate)
        m = metrics.build(spec, path, locate)
        m.column = column
        n = name(m)
        if n in seen:
            raise ConfigError(f"metric {n} is listed twice (also at train.metrics[{seen[n]}]); to record it with "
                              f"other options too, give that entry a name of its own (name: {n}_2)", locate(path))
        seen[n] = i
        if m.task != task:
            kind = "class labels" if m.task == "classification" else "regression targets"
            raise ConfigError(f"metric {n} scores {kind}, but the loss {type(loss).__name__} is a {task} loss; "
                              f"metrics for {task}: {', '.join(for_task(task))}", locate(path))
        problem = m.setup(loss, outputs)
        if problem:
            raise ConfigError(f"metric {n}: {problem}", locate(path))
        if not m.recorded_always:
            chosen.append(m)
    return chosen


def for_task(task: str) -> list[str]:
    """The registered metrics that score a loss of ``task``."""
    return [n for n in metrics.names() if getattr(metrics.get(n), "task", None) == task]


def metric_mode(monitor: str, modes: dict | None = None) -> str:
    """Whether ``monitor`` (train_loss, val_mae, ...) improves downwards ("min") or upwards
    ("max"): losses min, accuracies max, a metric by its ``mode`` (``modes``: the run's, by
    column name; else the registered metric of that name)."""
    n = monitor.removeprefix("train_").removeprefix("val_")
    if n == "loss":
        return "min"
    if modes and n in modes:
        return modes[n]
    if n in metrics:
        return getattr(metrics.get(n), "mode", "min")
    return "max" if "accuracy" in n else "min"
