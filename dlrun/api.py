"""Everything a plugin author imports, from one place: ``from dlrun.api import Layer, layers``.

A plugin file defines components and registers them with the decorator of their kind::

    from dlrun.api import InputSpec, Layer, PositiveInt, layers

    @layers.register()
    class Doubler(Layer):
        \"\"\"y = 2x.\"\"\"

        input_spec = InputSpec(shape=("D",))

        def forward(self, x):
            return 2 * x

        def backward(self, dy):
            return 2 * dy

The base classes (what each kind implements), the registries (``@layers.register()``,
``@losses.register()``, ...), the option types that checked constructor options use
(``PositiveInt``, ``Range``, ...), the dataset a data generator returns, the callback a training
hook subclasses, and the backend helper for code that runs on numpy and CuPy alike
(``xp = array_module(x)``). Names imported from anywhere else inside dlrun may move between
releases; these do not.
"""
from __future__ import annotations

from .backend import array_module
from .data import Dataset
from .layers.base import InputSpec, Layer
from .layers.initializers import Initializer
from .layers.parameter import Parameter
from .layers.recurrent import Recurrent
from .losses.base import Loss
from .losses.regularizers import Regularizer
from .metrics.base import Metric
from .optimizers.base import Optimizer
from .registry import data, initializers, layers, losses, metrics, optimizers, regularizers, schedules
from .registry.options import (FilePath, Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                               Range, UnitInterval)
from .schedules.base import Schedule
from .training.hooks import Callback

__all__ = [
    # what each kind of component implements
    "Layer", "InputSpec", "Parameter", "Recurrent", "Initializer", "Loss", "Regularizer", "Optimizer", "Schedule",
    "Metric", "Callback", "Dataset",
    # the registries: @layers.register(), @losses.register(), ...
    "layers", "initializers", "losses", "regularizers", "optimizers", "schedules", "metrics", "data",
    # option types for checked constructor options
    "PositiveInt", "NonNegativeInt", "PositiveFloat", "NonNegativeFloat", "Fraction", "UnitInterval", "Range",
    "FilePath",
    # numpy or CuPy, from an array
    "array_module",
]
