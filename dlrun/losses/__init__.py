"""Loss functions: ``forward(z, y) -> scalar`` (mean over the batch) and ``backward() -> dz``.

``task`` tells the trainer how to score predictions: "classification" (integer labels,
accuracy from argmax) or "regression".
"""
from __future__ import annotations

from . import binary, regression, softmax  # noqa: F401  (registers the losses)
from .base import Loss

__all__ = ["Loss"]
