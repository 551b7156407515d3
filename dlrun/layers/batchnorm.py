"""BatchNorm: normalise each feature (or channel) with batch statistics while training."""
from __future__ import annotations

from typing import Annotated

import numpy as np

from ..registry.options import PositiveFloat, Range
from ..registry import layers
from .base import InputSpec, Layer


def standardize_backward(g, xhat, inv, axes):
    """∂L/∂x of x̂ = (x − μ)·inv, μ and inv = 1/sqrt(σ² + eps) over ``axes``, given g = ∂L/∂x̂:
    (g − mean(g) − x̂·mean(g ⊙ x̂))·inv, computed in place in g (shared by BatchNorm and LayerNorm)."""
    gm = g.mean(axis=axes, keepdims=True)
    gx = (g * xhat).mean(axis=axes, keepdims=True)
    g -= gm
    g -= xhat * gx
    g *= inv
    return g


@layers.register()
class BatchNorm(Layer):
    """y = γ·(x − μ)/sqrt(σ² + eps) + β, per feature (2-D input) or per channel (4-D input).

    Training: μ and σ² are the mean and (biased) variance over the batch — over axis 0 for
    (N, D) input, over axes (0, 2, 3) for (N, C, H, W) input (any rank: all axes but 1) — and the
    running statistics are updated as
    running_mean ← momentum·running_mean + (1 − momentum)·μ and
    running_var ← momentum·running_var + (1 − momentum)·σ²·m/(m − 1)
    (m values per feature; the unbiased variance, as in PyTorch). A training batch with a single
    value per feature (one (N, D) sample, the last batch of an epoch when the training set size is
    1 more than a multiple of batch_size) normalises to β and leaves the running statistics as they
    are: its unbiased variance is undefined (PyTorch refuses such a batch; set
    ``train.drop_last: true`` to skip it).
    Evaluation: μ and σ² are the running statistics, so the layer is a fixed affine map.

    Backward (training), with x̂ = (x − μ)/sqrt(σ² + eps) and g = dy·γ, means over the m values:
    ∂L/∂x = (g − mean(g) − x̂·mean(g·x̂)) / sqrt(σ² + eps); ∂L/∂γ = Σ dy·x̂; ∂L/∂β = Σ dy.

    Args:
        momentum: weight of the old running statistics in each update, in [0, 1) (Keras
            convention; PyTorch's momentum=0.1 is momentum: 0.9 here).
        eps: added to the variance before the square root.
        center: learn the shift β (else β = 0).
        scale: learn the scale γ (else γ = 1).
        sync: in a data-parallel run (``mpiexec -n K``), compute μ and σ² (and the means of
            backward) over the global batch, summed across the ranks, so that K ranks train
            as one process (PyTorch's SyncBatchNorm); false keeps per-rank statistics over each
            rank's part of the batch (PyTorch DDP's default). One process: no effect.

    Shape:
        input (N, D) or (N, C, ...) -> output of the same shape. γ, β and the running statistics
        have shape (D,) or (C,).

    Attributes:
        running_mean, running_var: the running statistics (layer state: saved in checkpoints,
            frozen by gradcheck).
    """

    has_phase = True
    state = ("running_mean", "running_var")
    input_spec = InputSpec(shape=("C", "H", "W"))

    def __init__(self, momentum: Annotated[float, Range(0, 1, max_inclusive=False)] = 0.9,
                 eps: PositiveFloat = 1e-5, center: bool = True, scale: bool = True, sync: bool = False):
        self.sync = sync
        self.momentum = momentum
        self.eps = eps
        self.center = center
        self.scale = scale

    def build(self, input_shape):
        c = int(input_shape[0])
        self.gamma = self.add_param("gamma", (c,), value=np.ones(c), trainable=self.scale, regularize=False)
        self.beta = self.add_param("beta", (c,), value=np.zeros(c), trainable=self.center, regularize=False)
        self.running_mean = self.backend.asarray(np.zeros(c), dtype=self.dtype)
        self.running_var = self.backend.asarray(np.ones(c), dtype=self.dtype)
        # per-feature vectors broadcast against (N, C, 1, 1, ...); reduce over every axis but 1
        self._bshape = (1, c) + (1,) * (len(input_shape) - 1)
        self._axes = (0,) + tuple(range(2, len(input_shape) + 1))
        return tuple(input_shape)

    def forward(self, x, y=None):
        xp = self.xp
        shp, axes = self._bshape, self._axes
        if self.training:
            if self.sync and self.world is not None:
                mu, xc, var, m = self._global_moments(x)
            else:
                mu = x.mean(axis=axes, keepdims=True)
                xc = x - mu
                var = (xc * xc).mean(axis=axes, keepdims=True)
                m = x.size // x.shape[1]
            if m is None or m > 1:  # one value has no unbiased variance: it would pull running_var towards 0
                a = self.momentum
                self.running_mean *= a
                self.running_mean += (1.0 - a) * mu.reshape(-1)
                self.running_var *= a
                unbias = (1.0 - a) * m / (m - 1) if m is not None else (1.0 - a) * self._count / (self._count - 1)
                self.running_var += unbias * var.reshape(-1)
        else:
            xc = x - self.running_mean.reshape(shp)
            var = self.running_var.reshape(shp)
        inv = 1.0 / xp.sqrt(self.eps + var)
        xhat = xc * inv
        self._xhat, self._inv, self._phase = xhat, inv, self.training
        out = xhat * self.gamma.data.reshape(shp)
        out += self.beta.data.reshape(shp)
        return out

    def _global_moments(self, x):
        """μ, x − μ and σ² over the global batch of a data-parallel run, from sums over every
        rank's part (two collectives); m is None: the global count stays on the device (the
        ranks hold at least one sample each, so it is above 1)."""
        axes, shp, xp = self._axes, self._bshape, self.xp
        c = x.shape[1]
        local = xp.concatenate([x.sum(axis=axes).reshape(-1), xp.asarray([x.size // c], dtype=x.dtype)])
        total = self.world.sum_device(local)
        self._count = total[c:]
        mu = (total[:c] / self._count).reshape(shp)
        xc = x - mu
        var = (self.world.sum_device((xc * xc).sum(axis=axes)) / self._count).reshape(shp)
        return mu, xc, var, None

    def backward(self, dy):
        shp, axes = self._bshape, self._axes
        xhat = self._xhat
        if self.gamma.trainable:
            (dy * xhat).sum(axis=axes, out=self.gamma.grad)
        if self.beta.trainable:
            dy.sum(axis=axes, out=self.beta.grad)
        g = dy * self.gamma.data.reshape(shp)
        if not self._phase:  # evaluation: a fixed affine map
            return g * self._inv
        if self.sync and self.world is not None:  # the means of g and g·x̂ over the global batch
            both = self.world.sum_device(self.xp.concatenate([g.sum(axis=axes).reshape(-1),
                                                              (g * xhat).sum(axis=axes).reshape(-1)]))
            m, c = self._count, g.shape[1]
            g -= both[:c].reshape(shp) / m
            g -= xhat * (both[c:].reshape(shp) / m)
            g *= self._inv
            return g
        return standardize_backward(g, xhat, self._inv, axes)

    def __repr__(self) -> str:
        return f"BatchNorm(momentum={self.momentum}, eps={self.eps}{', sync=True' if self.sync else ''})"

