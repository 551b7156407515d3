"""Weight initializers. Each draws on the host with the model's seeded numpy Generator.

An initializer is called as ``init(shape, fan_in, fan_out, rng)`` and returns a float64 numpy
array; the layer casts it to the model dtype and moves it to the device once, so CPU and GPU
runs with the same seed start from identical weights.
"""
from __future__ import annotations

import math

import numpy as np

from .options import NonNegativeFloat, PositiveFloat
from .registry import initializers


class Initializer:
    """Base class: ``__call__(shape, fan_in, fan_out, rng) -> np.ndarray``."""

    def __call__(self, shape, fan_in: int, fan_out: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        return getattr(self, "registered_name", type(self).__name__)


initializers.base = Initializer


@initializers.register("zeros")
class Zeros(Initializer):
    """w = 0."""

    def __call__(self, shape, fan_in, fan_out, rng):
        return np.zeros(shape)


@initializers.register("constant")
class Constant(Initializer):
    """w = value.

    Args:
        value: the constant.
    """

    def __init__(self, value: float = 0.0):
        self.value = value

    def __call__(self, shape, fan_in, fan_out, rng):
        return np.full(shape, self.value, dtype=np.float64)


@initializers.register("uniform")
class Uniform(Initializer):
    """w ~ U[low, high).

    Args:
        low: lower bound.
        high: upper bound (must exceed low).
    """

    def __init__(self, low: float = -0.05, high: float = 0.05):
        if not high > low:
            raise ValueError(f"high must exceed low, got low={low}, high={high}")
        self.low, self.high = low, high

    def __call__(self, shape, fan_in, fan_out, rng):
        return rng.uniform(self.low, self.high, size=shape)


@initializers.register("normal")
class Normal(Initializer):
    """w ~ N(mean, std²).

    Args:
        mean: mean.
        std: standard deviation.
    """

    def __init__(self, mean: float = 0.0, std: NonNegativeFloat = 0.05):
        self.mean, self.std = mean, std

    def __call__(self, shape, fan_in, fan_out, rng):
        return rng.normal(self.mean, self.std, size=shape)


class _Scaled(Initializer):
    """Variance-scaling family: Var(w) = gain² · scale / fan (Glorot 2010, He 2015)."""

    distribution = "uniform"
    mode = "fan_avg"
    scale = 1.0

    def __init__(self, gain: PositiveFloat = 1.0):
        self.gain = gain

    def std(self, fan_in, fan_out) -> float:
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[self.mode]
        return self.gain * math.sqrt(self.scale / max(fan, 1))

    def __call__(self, shape, fan_in, fan_out, rng):
        std = self.std(fan_in, fan_out)
        if self.distribution == "uniform":
            limit = math.sqrt(3.0) * std
            return rng.uniform(-limit, limit, size=shape)
        return rng.normal(0.0, std, size=shape)


@initializers.register("xavier_uniform")
class XavierUniform(_Scaled):
    """w ~ U[-a, a], a = gain·sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010).

    Args:
        gain: multiplies the bound.
    """


@initializers.register("xavier_normal")
class XavierNormal(_Scaled):
    """w ~ N(0, σ²), σ = gain·sqrt(2 / (fan_in + fan_out)).

    Args:
        gain: multiplies σ.
    """

    distribution = "normal"


@initializers.register("he_uniform")
class HeUniform(_Scaled):
    """w ~ U[-a, a], a = gain·sqrt(6 / fan_in) (He et al. 2015), for ReLU nets.

    Args:
        gain: multiplies the bound.
    """

    mode = "fan_in"
    scale = 2.0


@initializers.register("he_normal")
class HeNormal(_Scaled):
    """w ~ N(0, σ²), σ = gain·sqrt(2 / fan_in) (He et al. 2015), for ReLU nets.

    Args:
        gain: multiplies σ.
    """

    mode = "fan_in"
    scale = 2.0
    distribution = "normal"
