"""NormalizedDense: the MXNet custom-layer tutorial's parameterized NormalizationHybridLayer."""
from __future__ import annotations

from .initializers import Initializer
from ..registry.options import PositiveInt
from ..registry import layers
from .base import InputSpec, Layer
from .linear import _init
from .minmax import minmax_backward, minmax_forward, minmax_kink_distance


@layers.register()
class NormalizedDense(Layer):
    """y = s ⊙ (n Wᵀ) with n = (x − min x)/(max x − min x) over the batch and constant scales s.

    W (hidden_units, in_features) is trainable, its input size inferred when the model is
    built; ``scales`` is a non-trainable constant parameter: it is saved in checkpoints but
    no optimizer or regularizer ever changes it. Backward: ∂L/∂W = (G ⊙ s)ᵀ n, and ∂L/∂n =
    (G ⊙ s) W flows through the min-max normalization (see MinMaxNormalization).

    Args:
        hidden_units: output features (rows of W).
        scales: the constant s: one value for every output, or one per output.
        weight_initializer: initializer for W (the tutorial uses Xavier).

    Shape:
        input (N, in_features) -> output (N, hidden_units).
    """

    input_spec = InputSpec(shape=("D",), options={"hidden_units": "C"})

    def __init__(self, hidden_units: PositiveInt, scales: tuple[float, ...] = (2.0,),
                 weight_initializer: Initializer = "xavier_uniform"):
        if len(scales) not in (1, hidden_units):
            raise ValueError(f"scales must have 1 or hidden_units={hidden_units} values, got {len(scales)}")
        self.hidden_units = hidden_units
        self.scales_value = tuple(float(s) for s in scales)
        self.weight_initializer = _init(weight_initializer)

    def build(self, input_shape):
        self.expect_rank(input_shape, 1, "(N, features) input; add a Flatten before it")
        d = input_shape[0]
        self.weights = self.add_param("weights", (self.hidden_units, d), self.weight_initializer,
                                      fan_in=d, fan_out=self.hidden_units)
        self.scales = self.add_param("scales", (len(self.scales_value),), value=self.scales_value, trainable=False)
        return (self.hidden_units,)

    def forward(self, x, y=None):
        n, self._cache = minmax_forward(x)
        self._n = n
        return (n @ self.weights.data.T) * self.scales.data

    def backward(self, dy):
        dz = dy * self.scales.data
        self.xp.matmul(dz.T, self._n, out=self.weights.grad)
        return minmax_backward(dz @ self.weights.data, self._cache)

    def branch_signature(self):
        return self._cache[:2]

    def kink_distance(self, x, y=None):  # the kinks are min-max normalisation's, on x alone
        return minmax_kink_distance(x)
