"""The loss base class: ``forward(z, y) -> scalar`` (batch mean), ``backward() -> dz``."""
from __future__ import annotations

from typing import Annotated, Literal

import numpy as np

from ..backend import array_module
from ..backend.buffers import BufferPool
from ..errors import ConfigError
from ..registry.options import Range
from ..registry import losses

BALANCED = "balanced"
# the class_weights option of classification losses: w_k ≥ 0 per class k, not all 0; or
# "balanced", resolved from the training labels when training starts (Loss.balance)
ClassWeights = list[Annotated[float, Range(min=0)]] | Literal["balanced"] | None


def weighted_sum(xp, values, weights):
    """Σᵢ valuesᵢ·weightsᵢ: numpy's dot on the CPU; on the GPU a product and a sum, which a CUDA
    graph can capture (CuPy's dot is a cuBLAS call, refused while a step is captured)."""
    return np.dot(values, weights) if xp is np else (values * weights).sum()


def weights_option(values) -> tuple | str | None:
    """The class_weights option as a tuple (or "balanced"); ValueError when every weight is 0
    (nothing to learn)."""
    if values is None or values == BALANCED:
        return values
    if not any(v > 0 for v in values):
        raise ValueError(f"class_weights must have at least one weight above 0, got {list(values)}")
    return tuple(float(v) for v in values)


class Loss:
    """Base class for losses."""

    task = "classification"
    class_weights = None  # classification losses that take the option: one weight per class, or None

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self.buffers = BufferPool()  # enabled by the trainer while it owns the gradients (see dlrun.backend.buffers)
        return self

    def forward(self, z, y):
        raise NotImplementedError

    def backward(self):
        raise NotImplementedError

    def predict(self, z):
        """Turn model outputs into the values ``dlrun predict`` reports (class index or value)."""
        return z.argmax(axis=1) if self.task == "classification" else z

    def count_correct(self, z, y):
        """How many predictions of ``z`` match ``y`` (classification), as a device scalar on GPU.

        The trainer calls it right after ``forward(z, y)`` with the same arrays, so a loss may
        answer from what its forward computed; the default compares ``predict(z)`` with ``y``."""
        return array_module(z).count_nonzero(self.predict(z) == y)  # ~5x cheaper than .sum()

    def kink_distance(self, z, y):
        """How far the scores ``z`` (labels ``y``) are from a kink of the loss, or None (smooth):
        |m| / ‖∇m‖₂ for each quantity m whose sign picks a branch (see Layer.kink_distance)."""
        return None

    def probabilities(self, z):
        """Class probabilities for ``--proba`` (classification losses only)."""
        raise NotImplementedError(f"{type(self).__name__} gives no probabilities")

    def classes(self, outputs: int) -> int:
        """How many classes ``outputs`` model outputs score (one score per class here)."""
        return outputs

    def check_outputs(self, classes: int, outputs: int) -> str | None:
        """Why labels 0..classes−1 cannot be scored from ``outputs`` model outputs, or None."""
        if classes > outputs:
            return (f"has labels up to {classes - 1}, but the model outputs {outputs} scores "
                    f"(set the last layer's units to {classes})")
        return None

    def check_weights(self, outputs: int) -> str | None:
        """Why ``class_weights`` cannot weight the classes ``outputs`` model outputs score, or None."""
        w, classes = self.class_weights, self.classes(outputs)
        if w is not None and w != BALANCED and len(w) != classes:
            scorer = "the model" if classes == outputs else type(self).__name__
            return f"{len(w)} weights, but {scorer} scores {classes} classes: give one weight per class"
        return None

    def class_counts(self, y, classes: int) -> np.ndarray:
        """How many samples of the labels ``y`` (host) each of ``classes`` classes has."""
        y = np.asarray(y).ravel()
        return np.bincount(y[(y >= 0) & (y < classes)], minlength=classes).astype(np.float64)

    def balance(self, y, outputs: int) -> str | None:
        """Resolve ``class_weights: balanced`` from the training labels ``y`` (host):
        w_k = n / (C·n_k), so every class weighs as much in the loss as a class of the average
        size (scikit-learn's ``compute_class_weight("balanced")``). Returns why it cannot (a class
        without samples), or None; nothing changes unless the weights are "balanced"."""
        if self.class_weights != BALANCED:
            return None
        counts = self.class_counts(y, self.classes(outputs))
        empty = np.flatnonzero(counts == 0)
        if empty.size:
            return (f"balanced: class {int(empty[0])} has no training samples, so n / (C·n_k) has no value for it; "
                    f"give the weights as a list, one per class")
        self.class_weights = tuple(float(w) for w in counts.sum() / (len(counts) * counts))
        return None

    def resolved_weights(self) -> tuple | None:
        """``class_weights`` for computing: a tuple or None, never the unresolved "balanced"."""
        if self.class_weights == BALANCED:
            raise ConfigError(f"{type(self).__name__}: class_weights: balanced is computed from the training labels "
                              f"when training starts; train first, or give the weights as a list")
        return self.class_weights

    def sample_weights(self, y, like, out=None):
        """w[y]: each sample's class weight as an array of ``like``'s dtype on its device (into
        ``out`` when given), or None without class_weights. The weights go to the device once."""
        if self.resolved_weights() is None:
            return None
        xp = array_module(like)
        table = self.__dict__.get("_weight_table")
        if table is None or array_module(table) is not xp or table.dtype != like.dtype:
            table = self._weight_table = xp.asarray(self.class_weights, dtype=like.dtype)
        return table.take(y, out=out)

    def _weights_repr(self) -> str:
        w = self.class_weights
        return "" if w is None else f"class_weights={w if w == BALANCED else list(w)}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._weights_repr()})"


losses.base = Loss
