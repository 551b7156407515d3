"""A corpus plugin: an identity layer with a Fraction option (like a dropout rate) and a
UnitInterval option (like a top-k fraction), to test out-of-range values."""
from dlrun.layers import Layer
from dlrun.registry.options import Fraction, UnitInterval
from dlrun.registry import layers


@layers.register()
class Ranged(Layer):
    """y = x.

    Args:
        rate: a fraction in [0, 1).
        k: a fraction in (0, 1].
    """

    def __init__(self, rate: Fraction = 0.5, k: UnitInterval = 1.0):
        self.rate, self.k = rate, k

    def forward(self, x, y=None):
        return x

    def backward(self, dy):
        return dy
