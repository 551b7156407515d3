"""GELU: x·Φ(x), exact (the default, as in PyTorch and Keras) or with the tanh approximation."""
from __future__ import annotations

from typing import Literal

from ..backend import Kernel, out_args
from ..registry import layers
from ..backend.special import INV_SQRT_2PI, ndtr, normal_pdf
from .base import InputSpec, Layer

_TANH_C = 0.7978845608028654  # sqrt(2/pi)
_GELU = Kernel("T x", "T y, T p", "p = (T)0.5 * erfc(-x * (T)0.7071067811865476); y = x * p;", "dlrun_gelu")
_GELU_GRAD = Kernel("T dy, T x, T p", "T dx",  # Φ(x) + x·φ(x)
                    f"dx = dy * (p + x * (T){INV_SQRT_2PI!r} * exp((T)-0.5 * x * x));", "dlrun_gelu_grad")


@layers.register()
class GELU(Layer):
    """y = x·Φ(x), Φ the standard normal CDF; ∂y/∂x = Φ(x) + x·φ(x) (Hendrycks & Gimpel 2016).

    Args:
        approximate: "none" (default): Φ computed to float64 accuracy, like PyTorch's
            ``GELU()`` and Keras' ``gelu``; "tanh": y = ½·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))),
            PyTorch's ``approximate="tanh"`` (BERT, GPT-2), within 5e-4 of the exact form; its
            backward is the exact derivative of that formula.
    """

    input_spec = InputSpec(shape=("D", "C"))

    def __init__(self, approximate: Literal["none", "tanh"] = "none"):
        self.approximate = approximate

    def forward(self, x, y=None):
        if self.approximate == "tanh":
            return self._forward_tanh(x)
        xp = self.xp
        fused = _GELU.on(xp)
        if fused is not None:  # GPU: one launch, CUDA's erfc
            y, p = self.output_array("y", x.shape, x.dtype), self.output_array("p", x.shape, x.dtype)
            self._x, self._p = x, p
            fused(x, y, p)
            return y
        self._x, self._p = x, ndtr(x)
        return xp.multiply(x, self._p, out=self.buffer("y", x.shape, x.dtype))

    def backward(self, dy):
        if self.approximate == "tanh":
            return self._backward_tanh(dy)
        x, p = self._x, self._p
        fused = _GELU_GRAD.on(self.xp)
        if fused is not None:
            return fused(dy, x, p, *out_args(self.buffer("dx", dy.shape, dy.dtype)))
        dx = normal_pdf(x)
        dx *= x
        dx += p
        dx *= dy
        return dx

    # The tanh form in place, into the layer's buffers: the same operations in the same order as
    # t = tanh(C·(x + 0.044715·x³)), y = ½x·(1 + t) and dx = dy·(½(1 + t) + ½x·(1 − t²)·C·(1 +
    # 3·0.044715·x²)), so the same bits, without the seven temporaries of writing it out

    def _forward_tanh(self, x):
        xp, buf, shape, dt = self.xp, self.buffer, x.shape, x.dtype
        u = xp.multiply(x, x, out=buf("u", shape, dt))
        u *= x
        u *= 0.044715
        u += x
        u *= _TANH_C
        t = xp.tanh(u, out=self.output_array("t", shape, dt))
        self._x, self._t = x, t
        y = xp.multiply(x, 0.5, out=buf("y", shape, dt))
        y *= xp.add(t, 1, out=u)
        return y

    def _backward_tanh(self, dy):
        xp, buf, x, t = self.xp, self.buffer, self._x, self._t
        shape, dt = dy.shape, dy.dtype
        du = xp.multiply(x, x, out=buf("du", shape, dt))
        du *= 3 * 0.044715
        du += 1
        du *= _TANH_C
        q = xp.multiply(t, t, out=buf("q", shape, dt))
        xp.subtract(1, q, out=q)
        h = xp.multiply(x, 0.5, out=buf("h", shape, dt))  # (½x·(1 − t²))·du
        h *= q
        h *= du
        dx = xp.add(t, 1, out=buf("dx", shape, dt))
        dx *= 0.5
        dx += h
        dx *= dy
        return dx
