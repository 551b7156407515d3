"""Optimizers update trainable parameters in place from their gradients, one small module each.

Importing this package registers them. Every update is done in place in the parameter's
dtype: no per-step allocation, no float64 scalars (hyperparameters are Python floats).
"""
from .base import Optimizer  # noqa: F401
from .sgd import SGD  # noqa: F401
from .adam import Adam, AdamW  # noqa: F401
from .adaptive import AdaGrad, RMSProp  # noqa: F401

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "AdaGrad", "RMSProp"]
