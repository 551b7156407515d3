"""LargeMarginFC: the seed-000 layer, a bias-free fully connected layer with a shrunk target logit."""
from __future__ import annotations

from typing import Annotated

from .initializers import Initializer
from ..registry.options import PositiveInt, Range
from ..registry import layers
from .base import InputSpec, Layer
from .linear import _init


@layers.register()
class LargeMarginFC(Layer):
    """f = x Wᵀ; in training out[i, y_i] = k·f[i, y_i] where f[i, y_i] > 0, every other out = f.

    The target-class logit is made smaller when it is positive, so the model must push it
    further to reach the same loss: a simplified large-margin softmax (Liu et al. 2016; see
    LSoftmax for the full form). In evaluation it is a plain fully connected layer.

    Backward (training): with Ĝ = S ⊙ G, where S is k at the (i, y_i) whose forward logit was
    positive and 1 elsewhere, ∂L/∂x = Ĝ W and ∂L/∂W = Ĝᵀ x. The matrix product sums over
    repeated labels, so no scatter is needed. The kink is at f[i, y_i] = 0 (which takes the
    unscaled branch); ``branch_signature`` is the f[i, y_i] > 0 mask.

    Args:
        units: number of classes C (rows of W).
        k: the multiplier of positive target logits, 0 < k <= 1 (k = 1 is a plain FC).
        weight_initializer: initializer for W.

    Shape:
        input (N, D) and integer labels (N,) -> output (N, units).
    """

    needs_labels = True
    has_phase = True
    input_spec = InputSpec(shape=("D",), options={"units": "C"})

    def __init__(self, units: PositiveInt, k: Annotated[float, Range(0, 1, min_inclusive=False)] = 0.5,
                 weight_initializer: Initializer = "xavier_uniform"):
        self.units = units
        self.k = k
        self.weight_initializer = _init(weight_initializer)

    def build(self, input_shape):
        self.expect_rank(input_shape, 1, "(N, features) input; add a Flatten before it")
        d = input_shape[0]
        self.weight = self.add_param("weight", (self.units, d), self.weight_initializer, fan_in=d, fan_out=self.units)
        return (self.units,)

    def forward(self, x, y=None):
        xp = self.xp
        f = self.backend.matmul(x, self.weight.data.T)
        self._x = x
        self._scale = None
        if self.training and y is not None:
            # gather the target logits, scale the positive ones by k, scatter back: integer
            # indexing only (a boolean mask would make CuPy wait for the mask's count)
            rows = xp.arange(x.shape[0])
            target = f[rows, y]
            self._positive = xp.greater(target, 0)
            self._scale = xp.where(self._positive, x.dtype.type(self.k), x.dtype.type(1))
            self._rows, self._cols = rows, y
            f[rows, y] = target * self._scale
        return f

    def backward(self, dy):
        g = dy
        if self._scale is not None:
            g = dy.copy()
            g[self._rows, self._cols] *= self._scale
        self.backend.matmul(g.T, self._x, out=self.weight.grad)
        if not self.needs_input_grad:
            return None
        return self.backend.matmul(g, self.weight.data)

    def branch_signature(self):
        return self._positive if self._scale is not None else None

    def kink_distance(self, x, y=None):
        """|f_i| / ‖(x_i, w_{y_i})‖₂ for f_i = x_i·w_{y_i}, the target logits (training only)."""
        if not self.training or y is None:
            return None
        w = self.weight.data[y]
        f = (x * w).sum(axis=1)
        return abs(f) / self.xp.sqrt((x * x).sum(axis=1) + (w * w).sum(axis=1))
