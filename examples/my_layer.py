"""A user layer written as a plugin: the large-margin fully connected layer of the 2017 blog post "Way to implement custom Layer for Deep Learning framework".

Load it with ``--plugin examples/my_layer.py`` (gradcheck, train, list, show) or a config's
``plugins: [my_layer.py]``. docs/custom-layers.md walks through writing it.

Formulas (f = x Wᵀ, y_i the label of sample i, 0 < k <= 1):
    forward (training):  out[i, j] = f[i, j], except out[i, y_i] = k·f[i, y_i] when f[i, y_i] > 0
    forward (eval):      out = f
    backward: start from the plain FC gradients dX = G W and dW = Gᵀ X, then for every sample i
    whose target logit was positive add (k − 1)·G[i, y_i] times w_{y_i} to dX[i] and times x_i
    to dW[y_i]; labels repeat, so dW's correction is a scatter-add.
"""
from __future__ import annotations

from typing import Annotated

from dlrun.api import InputSpec, Layer, PositiveInt, Range, initializers, layers


@layers.register()
class MyMarginFC(Layer):
    """f = x Wᵀ; in training the target logit f[i, y_i] is multiplied by k where it is positive.

    Args:
        units: number of classes (rows of W).
        k: multiplier of positive target logits, 0 < k <= 1.
    """

    needs_labels = True  # forward(x, y) gets the integer labels
    has_phase = True  # training and evaluation differ: gradcheck checks both
    input_spec = InputSpec(shape=("D",), options={"units": "C"})

    def __init__(self, units: PositiveInt = 3, k: Annotated[float, Range(0, 1, min_inclusive=False)] = 0.5):
        self.units = units
        self.k = k

    def build(self, input_shape):
        d = input_shape[0]
        self.weight = self.add_param("weight", (self.units, d), initializers.build("xavier_uniform"))
        return (self.units,)

    def forward(self, x, y=None):
        f = x @ self.weight.data.T
        self._x, self._pos = x, None
        if self.training and y is not None:
            rows = self.xp.arange(len(x))
            pos = f[rows, y] > 0  # the branch each sample took, cached for backward
            self._pos, self._rows, self._y = pos, rows[pos], y[pos]
            f[self._rows, self._y] *= x.dtype.type(self.k)
        return f

    def backward(self, dy):
        w, x = self.weight.data, self._x
        dx = dy @ w
        self.weight.grad[...] = dy.T @ x
        if self._pos is not None:
            coeff = (self.k - 1) * dy[self._rows, self._y]  # (k − 1)·G[i, y_i]
            dx[self._rows] += coeff[:, None] * w[self._y]
            # w_grad[y] += ... would drop repeated labels: scatter-add keeps them all
            self.backend.scatter_add(self.weight.grad, self._y, coeff[:, None] * x[self._rows])
        return dx

    def branch_signature(self):
        return self._pos  # the kink: a target logit changing sign

    def kink_distance(self, x, y=None):
        """How far from that kink: |f_i| / ‖∇f_i‖₂ with f_i = x_i·w_{y_i} (training only)."""
        if not self.training or y is None:
            return None
        w = self.weight.data[y]
        f = (x * w).sum(axis=1)
        return abs(f) / self.xp.sqrt((x * x).sum(axis=1) + (w * w).sum(axis=1))
