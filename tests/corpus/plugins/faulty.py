"""Corpus plugin layers that inject non-finite values, for the NaN-diagnosis tests."""
from dlrun.layers import Layer
from dlrun.registry.options import PositiveInt
from dlrun.registry import layers


@layers.register()
class NaNBackward(Layer):
    """y = x; its backward returns NaN (a broken hand-written gradient)."""

    def forward(self, x, y=None):
        return x

    def backward(self, dy):
        return dy * float("nan")


@layers.register()
class NaNForwardAt(Layer):
    """y = x, except that training forward call number ``call`` (and later) returns NaN.

    ``calls`` is declared as layer state, so the trainer's replay restores it like a running
    statistic and sees the same calls again.

    Args:
        call: the first training forward call (1-based) that outputs NaN.
    """

    state = ("calls",)

    def __init__(self, call: PositiveInt = 1):
        self.call = call
        self.calls = 0

    def forward(self, x, y=None):
        if self.training:
            self.calls += 1
            if self.calls >= self.call:
                return x * float("nan")
        return x

    def backward(self, dy):
        return dy
