"""The loss base class: ``forward(z, y) -> scalar`` (batch mean), ``backward() -> dz``."""
from __future__ import annotations

from ..backend import array_module
from ..buffers import BufferPool
from ..registry import losses


class Loss:
    """Base class for losses."""

    task = "classification"

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self.buffers = BufferPool()  # enabled by the trainer while it owns the gradients (see dlrun.buffers)
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


losses.base = Loss
