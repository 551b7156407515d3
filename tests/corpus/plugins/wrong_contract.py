"""Corpus plugin layers that break the layer contract: an output of the wrong dtype, a dx of the
wrong shape (the first forward and backward name them, with the line of the method)."""
import numpy as np

from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Float64Forward(Layer):
    """y = 2x, returned as float64 in a float32 model."""

    def forward(self, x, y=None):
        return (2 * x).astype(np.float64)

    def backward(self, dy):
        return 2 * dy


@layers.register()
class ShortBackward(Layer):
    """y = x; backward drops all but the first column of dx."""

    def forward(self, x, y=None):
        return x * 1

    def backward(self, dy):
        return dy[:, :1]
