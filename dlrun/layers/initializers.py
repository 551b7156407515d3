"""Weight initializers. Each draws on the host with the model's seeded numpy Generator.

An initializer is called as ``init(shape, fan_in, fan_out, rng)`` and returns a float64 numpy
array; the layer casts it to the model dtype and moves it to the device once, so CPU and GPU
runs with the same seed start from identical weights.
"""
from __future__ import annotations

import math

import numpy as np

from ..registry.options import NonNegativeFloat, PositiveFloat
from ..registry import initializers


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


@initializers.register("ones")
class Ones(Initializer):
    """w = 1 (a scale's usual start: Keras' "ones", torch.nn.init.ones_)."""

    def __call__(self, shape, fan_in, fan_out, rng):
        return np.ones(shape)


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


@initializers.register("lecun_uniform")
class LecunUniform(_Scaled):
    """w ~ U[-a, a], a = gain·sqrt(3 / fan_in) (LeCun et al. 1998): Var(w) = gain²/fan_in, for SELU/tanh nets.

    Args:
        gain: multiplies the bound.
    """

    mode = "fan_in"


@initializers.register("lecun_normal")
class LecunNormal(_Scaled):
    """w ~ N(0, σ²), σ = gain·sqrt(1 / fan_in) (LeCun et al. 1998).

    Untruncated, like he_normal here and torch; Keras draws a truncated normal instead.

    Args:
        gain: multiplies σ.
    """

    mode = "fan_in"
    distribution = "normal"


@initializers.register("orthogonal")
class Orthogonal(Initializer):
    """W = gain·Q, Q from the QR decomposition of a Gaussian matrix, sign-corrected (Saxe et al. 2014).

    The shape is viewed as (shape[0], prod(shape[1:])) (conv kernels flatten their trailing
    dims). Q = QR(A)'s Q with each column multiplied by sign(R_jj), which makes Q uniformly
    distributed over orthogonal matrices. Rows are orthonormal when shape[0] ≤ the rest
    (W Wᵀ = gain²·I), else columns are (Wᵀ W = gain²·I). Needs at least 2 dimensions.

    Args:
        gain: multiplies Q.
    """

    def __init__(self, gain: PositiveFloat = 1.0):
        self.gain = gain

    def __call__(self, shape, fan_in, fan_out, rng):
        shape = tuple(shape)
        if len(shape) < 2:
            raise ValueError(f"orthogonal needs a weight with at least 2 dimensions, got shape {shape}")
        rows, cols = shape[0], math.prod(shape[1:])
        a = rng.standard_normal((max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(a)
        q *= np.where(np.diag(r) < 0, -1.0, 1.0)
        if rows < cols:
            q = q.T
        return (self.gain * q).reshape(shape)


@initializers.register("truncated_normal")
class TruncatedNormal(Initializer):
    """w ~ N(mean, std²) truncated to [mean − 2·std, mean + 2·std] by redrawing the values outside.

    Each round redraws all out-of-range entries at once (about 4.6 % of the previous round),
    so it is vectorised and ends after a few rounds. The result has variance ≈ 0.774·std²
    (Keras and torch's trunc_normal_ with the same bounds behave alike).

    Args:
        mean: mean of the untruncated normal.
        std: standard deviation of the untruncated normal.
    """

    def __init__(self, mean: float = 0.0, std: NonNegativeFloat = 0.05):
        self.mean, self.std = mean, std

    def __call__(self, shape, fan_in, fan_out, rng):
        w = rng.normal(self.mean, self.std, size=shape)
        bad = np.flatnonzero(np.abs(w - self.mean) > 2 * self.std)
        flat = w.reshape(-1)
        while bad.size:
            flat[bad] = rng.normal(self.mean, self.std, size=bad.size)
            bad = bad[np.abs(flat[bad] - self.mean) > 2 * self.std]
        return w
