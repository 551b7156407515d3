"""A plugin layer with two inputs: y = a W bᵀ + bias, one bilinear form per output unit
(PyTorch's nn.Bilinear). Check it with ``dlrun gradcheck MyBilinear --plugin examples/bilinear.py``;
train the config beside it with ``dlrun train examples/bilinear.yaml``."""
from dlrun.api import InputSpec, Layer, PositiveInt, layers


@layers.register()
class MyBilinear(Layer):
    """y[n, k] = Σ_ij a[n, i] · W[k, i, j] · b[n, j] + bias[k].

    Args:
        units: outputs (one bilinear form each).

    Shape:
        inputs a (N, I) and b (N, J) -> output (N, units).
    """

    num_inputs = 2                                       # build, forward get two; backward returns two
    input_spec = InputSpec(inputs=(("D",), ("C",)), options={"units": "H"})

    def __init__(self, units: PositiveInt = 4):
        self.units = units

    def build(self, a_shape, b_shape):                   # one per-sample shape per input
        i, j = a_shape[0], b_shape[0]
        self.weight = self.add_param("weight", (self.units, i, j), "xavier_uniform", fan_in=i * j,
                                     fan_out=self.units)
        self.bias = self.add_param("bias", (self.units,), "zeros")
        return (self.units,)

    def forward(self, a, b):                             # the inputs, in the order the node lists them
        self._a, self._b = a, b
        return self.xp.einsum("ni,kij,nj->nk", a, self.weight.data, b) + self.bias.data

    def backward(self, dy):
        a, b, w, xp = self._a, self._b, self.weight.data, self.xp
        self.weight.grad[...] = xp.einsum("nk,ni,nj->kij", dy, a, b)
        self.bias.grad[...] = dy.sum(0)
        da = xp.einsum("nk,kij,nj->ni", dy, w, b)
        db = xp.einsum("nk,ni,kij->nj", dy, a, w)
        return da, db                                    # one gradient per input, in their order
