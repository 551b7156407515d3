"""Elementwise activations, Softmax and LogSoftmax: small layers with no parameters."""
from __future__ import annotations

import numpy as np

from ..backend import Kernel, out_args
from ..registry.options import NonNegativeFloat, PositiveFloat
from ..registry import layers
from .base import InputSpec, Layer

_ANY = InputSpec(shape=("D", "C"))
_RELU = Kernel("T x", "T y", "y = x * (T)(x > (T)0);", "dlrun_relu")
# (its y is ReLU's input x: x > 0 iff max(x, 0) > 0, NaN included)
_RELU_GRAD = Kernel("T dy, T y", "T dx", "dx = dy * (T)(y > (T)0);", "dlrun_relu_grad")


class _KinkAtZero:
    """For layers that change branch where x crosses 0: the distance to the kink is |x|."""

    def kink_distance(self, x, y=None):
        return abs(x)



@layers.register()
class ReLU(_KinkAtZero, Layer):
    """y = max(x, 0); ∂y/∂x = 1 where x > 0, else 0 (the kink at 0 takes the 0 branch)."""

    input_spec = _ANY
    keeps_output = False  # (backward reads the mask, or on the GPU the input: never the output)

    def forward(self, x, y=None):
        xp = self.xp
        fused = _RELU.on(xp)
        if fused is not None:  # GPU: one launch, and backward reads the mask off x (x > 0 iff y > 0)
            self._mask, self._x = None, x
            return fused(x, *out_args(self.buffer("y", x.shape, x.dtype)))
        # CPU: the mask as 0/1 in x's dtype: multiplying by it is ~2.5x faster than by a bool
        # mask (no cast in the loop), and both beat maximum(x, 0) and copyto(where=) (~17x slower).
        # It takes as much memory as the output PyTorch's ReLU keeps for its backward.
        pool = self.buffers  # (asked directly: the layer most networks have, twice a step)
        mask = pool.get(xp, "mask", x.shape, x.dtype)
        # (numpy's ufuncs, their outputs given positionally: the same loops, less Python per call)
        self._mask = np.greater(x, 0, xp.empty(x.shape, x.dtype) if mask is None else mask)
        # the output over the input where nothing reads the input again (owns_input: after a
        # Linear, in training): one activation-sized array less per step (spiral: ~1.4 us of 67)
        return np.multiply(x, self._mask, x if self.owns_input else pool.get(xp, "y", x.shape, x.dtype))

    def backward(self, dy):
        if self._mask is None:
            return _RELU_GRAD.on(self.xp)(
                dy, self._x, *out_args(self.buffer("dx", dy.shape, dy.dtype)))
        # in fast mode dx goes into the mask's own buffer, which nothing reads after backward: a
        # third activation-sized array would cost one more pass of fresh memory (in-place on the
        # mask, about 1 us less per step on the spiral's 300x100; same values)
        mask = self._mask
        # (numpy's dtypes of one type are one object: `is` spares the comparison's call; another
        # dtype object of the same type would take the separate buffer, and give the same values)
        out = mask if self.buffers.enabled and dy.dtype is mask.dtype else self.buffer("dx", dy.shape, dy.dtype)
        return np.multiply(dy, mask, out)  # (the CPU: numpy)

    def branch_signature(self):
        return self._mask != 0 if self._mask is not None else self._x > 0


@layers.register()
class LeakyReLU(_KinkAtZero, Layer):
    """y = x where x > 0, else slope·x.

    Args:
        slope: the slope for negative inputs (Keras calls it negative_slope).
    """

    input_spec = _ANY

    def __init__(self, slope: NonNegativeFloat = 0.01):
        self.slope = slope

    def forward(self, x, y=None):
        # scale = 1 where x > 0, else slope, as (1 − m)·slope + m from the 0/1 mask m: exact (each
        # term is 0 or the value), and on the CPU ~10x faster than where(), whose data-dependent
        # branch costs 40x a multiply on a random mask
        xp, buf = self.xp, self.buffer
        m = xp.greater(x, 0, out=self.output_array("m", x.shape, x.dtype))
        scale = xp.subtract(1, m, out=self.output_array("scale", x.shape, x.dtype))
        scale *= x.dtype.type(self.slope)
        scale += m
        self._m, self._scale = m, scale
        return xp.multiply(x, scale, out=buf("y", x.shape, x.dtype))

    def backward(self, dy):
        return self.xp.multiply(dy, self._scale, out=self.buffer("dx", dy.shape, dy.dtype))

    def branch_signature(self):
        return self._m != 0


@layers.register()
class Sigmoid(Layer):
    """y = 1 / (1 + exp(-x)); ∂y/∂x = y (1 - y). Computed without overflow for large |x|."""

    input_spec = _ANY

    def forward(self, x, y=None):
        # (x >= 0 ? 1 : e) / (1 + e) with e = exp(-|x|) in (0, 1]: never overflows. The numerator
        # is max(e, step(x)), step(x) = 1.0 where x >= 0 (e <= 1), so no where() is needed and
        # every pass writes into a reused buffer (in fast mode) on numpy and CuPy alike
        xp, buf = self.xp, self.buffer
        e = xp.abs(x, out=buf("e", x.shape, x.dtype))
        xp.negative(e, out=e)
        xp.exp(e, out=e)
        num = xp.greater_equal(x, 0, out=self.output_array("num", x.shape, x.dtype))  # 0/1 floats
        xp.maximum(num, e, out=num)
        e += 1
        self._y = xp.divide(num, e, out=buf("y", x.shape, x.dtype))
        return self._y

    def backward(self, dy):
        dx = self.xp.subtract(1, self._y, out=self.buffer("dx", dy.shape, dy.dtype))
        dx *= self._y
        dx *= dy
        return dx


@layers.register()
class Tanh(Layer):
    """y = tanh(x); ∂y/∂x = 1 - y²."""

    input_spec = _ANY

    def forward(self, x, y=None):
        self._y = self.xp.tanh(x, out=self.buffer("y", x.shape, x.dtype))
        return self._y

    def backward(self, dy):
        dx = self.xp.multiply(self._y, self._y, out=self.buffer("dx", dy.shape, dy.dtype))
        self.xp.subtract(1, dx, out=dx)
        dx *= dy
        return dx


@layers.register()
class Softmax(Layer):
    """y_i = exp(x_i - max x) / Σ_j exp(x_j - max x) over the last axis;
    ∂L/∂x = y ⊙ (dy - Σ_j dy_j y_j).

    For training a classifier prefer the fused SoftmaxCrossEntropy loss on raw scores; this
    layer is for models that must output probabilities.
    """

    input_spec = InputSpec(shape=("C",))

    def forward(self, x, y=None):
        e = self.xp.exp(x - x.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        self._y = e
        return e

    def backward(self, dy):
        s = (dy * self._y).sum(axis=-1, keepdims=True)
        return self._y * (dy - s)


@layers.register()
class ELU(_KinkAtZero, Layer):
    """y = x where x > 0, else alpha·(exp(x) − 1); ∂y/∂x = 1 where x > 0, else alpha·exp(x).

    The negative branch is computed with expm1 (full relative precision near 0) and the gradient
    from exp(x) itself, not as y + alpha, which cancels to 0 in float32 once exp(x) < 6e-8.

    Args:
        alpha: the value y approaches for large negative x (a kink at 0 unless alpha = 1).
    """

    input_spec = _ANY

    def __init__(self, alpha: NonNegativeFloat = 1.0):
        self.alpha = alpha

    def forward(self, x, y=None):
        # no where() (40x a multiply on the CPU): with m the 0/1 mask of x > 0, the output is
        # max(x, 0) + alpha·expm1(min(x, 0)) (one term is 0) and the gradient max(m, (1 − m)·
        # alpha·exp(min(x, 0))), 1 or alpha·exp(x) exactly
        xp, dt = self.xp, x.dtype.type
        m = xp.greater(x, 0, out=self.output_array("m", x.shape, x.dtype))
        neg = xp.minimum(x, 0, out=self.output_array("neg", x.shape, x.dtype))  # exp(neg) never overflows
        slope = xp.exp(neg, out=self.output_array("slope", x.shape, x.dtype))
        slope *= dt(self.alpha)
        slope *= xp.subtract(1, m, out=self.buffer("1-m", x.shape, x.dtype))
        xp.maximum(slope, m, out=slope)
        xp.expm1(neg, out=neg)
        neg *= dt(self.alpha)
        self._mask, self._slope = m, slope
        y = xp.maximum(x, 0, out=self.buffer("y", x.shape, x.dtype))
        y += neg
        return y

    def backward(self, dy):
        return self.xp.multiply(dy, self._slope, out=self.buffer("dx", dy.shape, dy.dtype))

    def branch_signature(self):
        return self._mask != 0


@layers.register()
class Softplus(Layer):
    """y = (1/beta)·log(1 + exp(beta·x)); ∂y/∂x = sigmoid(beta·x).

    Computed as max(x, 0) + log1p(exp(−beta·|x|))/beta, which never overflows.

    Args:
        beta: sharpness; large beta approaches ReLU.
    """

    input_spec = _ANY

    def __init__(self, beta: PositiveFloat = 1.0):
        self.beta = beta

    def forward(self, x, y=None):
        xp = self.xp
        bx = self.beta * x if self.beta != 1.0 else x
        e = xp.exp(-xp.abs(bx))  # in (0, 1]
        # sigmoid(bx) = (bx >= 0 ? 1 : e)/(1 + e), the numerator max(step(bx), e) (see Sigmoid)
        sig = xp.greater_equal(bx, 0, out=self.output_array("sig", x.shape, x.dtype))
        xp.maximum(sig, e, out=sig)
        sig /= 1 + e
        self._sig = sig
        out = xp.log1p(e)
        if self.beta != 1.0:
            out *= 1.0 / self.beta
        out += xp.maximum(x, 0)
        return out

    def backward(self, dy):
        return dy * self._sig


@layers.register()
class LogSoftmax(Layer):
    """y_i = x_i − log Σ_j exp(x_j) over the last axis; ∂L/∂x = dy − softmax(x)·Σ_j dy_j.

    Computed as x_i − m − log Σ_j exp(x_j − m) with m = max x, which never overflows.

    Pair it with the NLL loss; LogSoftmax + NLL equals SoftmaxCrossEntropy on raw scores.
    """

    input_spec = InputSpec(shape=("C",))

    def forward(self, x, y=None):
        xp = self.xp
        shifted = x - x.max(axis=-1, keepdims=True)
        lse = xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))
        out = shifted - lse
        self._y = out
        return out

    def backward(self, dy):
        return dy - self.xp.exp(self._y) * dy.sum(axis=-1, keepdims=True)
