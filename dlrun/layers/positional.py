"""PositionalEmbedding: a learned vector per position, added to each step of a sequence."""
from __future__ import annotations

from .initializers import Initializer
from ..losses.regularizers import Regularizer
from ..registry import layers
from .base import InputSpec, Layer
from .linear import _init


@layers.register()
class PositionalEmbedding(Layer):
    """y[n, t] = x[n, t] + P[t], with a learned table P of shape (T, E).

    Attention treats its input as a set: without a position signal, permuting the steps of a
    sequence permutes the output the same way. Put this after an ``Embedding`` (BERT's and
    GPT-2's learned positions) so that each step's vector says where it is.

    Input (N, T, E) -> output (N, T, E); P has one row per position of the sequences the model
    is built for (T and E are inferred). ∂L/∂P = Σ_n dy[n]; ∂L/∂x = dy.

    Args:
        weight_initializer: initializer for P (default U[-0.05, 0.05], as Embedding's).
        weight_regularizer: penalty on P (overrides the run-wide regularizer).

    Shape:
        input (N, T, E) -> output (N, T, E). T and E are inferred when the model is built: the
        table has one row per position of the sequences the model is built for.

    Example:
        ``- {type: PositionalEmbedding}`` after ``- {type: Embedding, input_dim: 100, output_dim: 32}``
    """

    input_spec = InputSpec(shape=("T", "D"))

    def __init__(self, weight_initializer: Initializer = "uniform", weight_regularizer: Regularizer | None = None):
        self.weight_initializer = _init(weight_initializer)
        self.weight_regularizer = weight_regularizer

    def build(self, input_shape):
        self.expect_rank(input_shape, 2, "(N, T, E) input, a sequence of T vectors of size E (an Embedding's output)")
        t, e = input_shape
        self.weight = self.add_param("weight", (t, e), self.weight_initializer, fan_in=e, fan_out=e,
                                     regularizer=self.weight_regularizer)
        return (t, e)

    def forward(self, x, y=None):
        return self.xp.add(x, self.weight.data, out=self.buffer("y", x.shape, x.dtype))

    def backward(self, dy):
        dy.sum(axis=0, out=self.weight.grad)
        return dy if self.needs_input_grad else None
