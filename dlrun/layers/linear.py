"""Linear: the fully connected layer."""
from __future__ import annotations

from .initializers import Initializer
from ..registry.options import PositiveInt
from ..losses.regularizers import Regularizer
from ..registry import initializers, layers
from .base import InputSpec, Layer


@layers.register()
class Linear(Layer):
    """y = x Wᵀ + b, with W of shape (units, in_features).

    Args:
        units: number of output features.
        use_bias: add the bias b.
        weight_initializer: initializer for W (name or spec).
        bias_initializer: initializer for b.
        weight_regularizer: penalty on W (overrides the run-wide regularizer).
        bias_regularizer: penalty on b (biases are otherwise not regularized).
        position_wise: also take input with more axes, (N, ..., in_features), and apply the
            same W and b to every vector along the last axis (PyTorch's and Keras' rule for
            such input): on a sequence (N, T, E), each step alike, as a transformer's
            feed-forward block. Off (the default), such input is a shape error.

    Shape:
        input (N, in_features) -> output (N, units). in_features is inferred when the model is built.
        With ``position_wise``: (N, ..., in_features) -> (N, ..., units).

    Example:
        ``- {type: Linear, units: 64, weight_initializer: he_normal}``
    """

    input_spec = InputSpec(shape=("D",), options={"units": "C"})
    keeps_output = False  # (backward reads the input and the weight, never the output)
    _steps = False  # position_wise on input with more axes than (N, features): set by build

    def __init__(self, units: PositiveInt, use_bias: bool = True,
                 weight_initializer: Initializer = "xavier_uniform",
                 bias_initializer: Initializer = "zeros",
                 weight_regularizer: Regularizer | None = None,
                 bias_regularizer: Regularizer | None = None,
                 position_wise: bool = False):
        self.units = units
        self.position_wise = position_wise
        self.use_bias = use_bias
        self.weight_initializer = _init(weight_initializer)
        self.bias_initializer = _init(bias_initializer)
        self.weight_regularizer = weight_regularizer
        self.bias_regularizer = bias_regularizer

    def build(self, input_shape):
        self._steps = self.position_wise and len(input_shape) > 1  # the axes before the last join the batch
        if not self._steps:
            self.expect_rank(input_shape, 1, "(N, features) input; add a Flatten before it" + (
                ", or set position_wise: true to apply it to each step" if len(input_shape) == 2 else ""))
        d = input_shape[-1]
        self.weight = self.add_param("weight", (self.units, d), self.weight_initializer,
                                     fan_in=d, fan_out=self.units, regularizer=self.weight_regularizer)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_param("bias", (self.units,), self.bias_initializer, fan_in=d,
                                       fan_out=self.units, regularizer=self.bias_regularizer,
                                       regularize=False)
        return tuple(input_shape[:-1]) + (self.units,)

    def forward(self, x, y=None):
        if self._steps:  # one GEMM over every position: (N·T, in) @ (in, units)
            self._shape = x.shape
            x = x.reshape(-1, x.shape[-1])
        self._x = x
        # (backend.matmul's output given positionally, as below: on the CPU it is numpy's matmul,
        # which then parses no keyword)
        out = self.backend.matmul(x, self.weight.data.T,
                                  self.buffers.get(self.xp, "y", (x.shape[0], self.units), x.dtype))
        if self.bias is not None:
            out += self.bias.data
        return out.reshape(self._shape[:-1] + (self.units,)) if self._steps else out

    def backward(self, dy):
        xp, mm = self.xp, self.backend.matmul
        if self._steps:
            dy = dy.reshape(-1, self.units)
        mm(dy.T, self._x, self.weight.grad)  # .T views go to BLAS as a flag: no copy
        if self.bias is not None:  # column sums as ones @ dy: a GEMV, ~3x faster than sum(axis=0) on few columns
            mm(self.buffers.ones(xp, dy.shape[0], dy.dtype), dy, self.bias.grad)
        if not self.needs_input_grad:
            return None
        # owns_input (in training, after a layer that never reads its output again): dx over the
        # input, which nothing reads after the lines above: one activation-sized array less per step
        x = self._x
        dx = mm(dy, self.weight.data, x if self.owns_input and x.dtype is dy.dtype else
                self.buffers.get(xp, "dx", x.shape, dy.dtype))
        return dx.reshape(self._shape) if self._steps else dx


def _init(spec):
    """Defaults are written as names in the signature; build them like config values."""
    return initializers.build(spec) if not isinstance(spec, Initializer) else spec
