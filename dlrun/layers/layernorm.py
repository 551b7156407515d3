"""LayerNorm: normalise each sample over its trailing axes, the same in training and evaluation."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..registry.options import PositiveFloat, PositiveInt
from ..registry import layers
from .base import InputSpec, Layer
from .batchnorm import standardize_backward


@layers.register()
class LayerNorm(Layer):
    """y = γ ⊙ (x − μ)/sqrt(σ² + eps) + β, with μ and σ² over each sample's last ``axes`` axes.

    Ba, Kiros & Hinton 2016. Unlike BatchNorm the statistics are per sample, so the layer
    behaves the same in training and evaluation and keeps no running statistics.

    Backward, with x̂ = (x − μ)/sqrt(σ² + eps), g = dy ⊙ γ and means over the normalised values
    of one sample: ∂L/∂x = (g − mean(g) − x̂·mean(g ⊙ x̂)) / sqrt(σ² + eps);
    ∂L/∂γ = Σ_batch dy ⊙ x̂; ∂L/∂β = Σ_batch dy.

    Args:
        axes: how many trailing axes are normalised together: 1 (default) is the feature axis,
            as Keras' ``LayerNormalization()`` and PyTorch's ``LayerNorm(D)``; 3 on (C, H, W)
            images is PyTorch's ``LayerNorm([C, H, W])``.
        eps: added to the variance before the square root (PyTorch's 1e-5; Keras uses 1e-3).
        center: learn the shift β (else β = 0).
        scale: learn the scale γ (else γ = 1).

    Shape:
        input (N, ..., *S) -> the same shape; S is the normalised trailing shape, and γ and β
        have shape S (one scale and shift per element, as in both frameworks).
    """

    input_spec = InputSpec(shape=("D", "H"))  # (3, 5) and (5, 4): never a 2-element axis, where the output is ±1

    def __init__(self, axes: PositiveInt = 1, eps: PositiveFloat = 1e-5, center: bool = True, scale: bool = True):
        self.axes = axes
        self.eps = eps
        self.center = center
        self.scale = scale

    def build(self, input_shape):
        if self.axes > len(input_shape):
            raise ShapeError(f"LayerNorm(axes={self.axes}) normalises {self.axes} trailing axes, but each sample "
                             f"has shape {tuple(input_shape)} ({len(input_shape)} axes)")
        shape = tuple(int(s) for s in input_shape[len(input_shape) - self.axes:])
        self.gamma = self.add_param("gamma", shape, value=np.ones(shape), trainable=self.scale, regularize=False)
        self.beta = self.add_param("beta", shape, value=np.zeros(shape), trainable=self.center, regularize=False)
        self._norm_axes = tuple(range(-self.axes, 0))
        self._batch_axes = tuple(range(len(input_shape) + 1 - self.axes))
        return tuple(input_shape)

    def forward(self, x, y=None):
        axes = self._norm_axes
        xc = x - x.mean(axis=axes, keepdims=True)
        var = (xc * xc).mean(axis=axes, keepdims=True)
        var += self.eps
        inv = self.xp.sqrt(var, out=var)
        self.xp.divide(1.0, inv, out=inv)
        xc *= inv  # x̂
        self._xhat, self._inv = xc, inv
        out = xc * self.gamma.data
        out += self.beta.data
        return out

    def backward(self, dy):
        axes, xhat = self._norm_axes, self._xhat
        if self.gamma.trainable:
            (dy * xhat).sum(axis=self._batch_axes, out=self.gamma.grad)
        if self.beta.trainable:
            dy.sum(axis=self._batch_axes, out=self.beta.grad)
        return standardize_backward(dy * self.gamma.data, xhat, self._inv, axes)

    def __repr__(self) -> str:
        return f"LayerNorm(axes={self.axes}, eps={self.eps})"
