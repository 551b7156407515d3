"""The order in which a Sequential model runs its layers."""
from __future__ import annotations

from .activations import ReLU
from .base import Layer
from .maxpool2d import MaxPool2D


def execution_order(layers: list[Layer]) -> list[int]:
    """The order in which Sequential runs ``layers``: list order, except that a ReLU directly
    followed by a MaxPool2D runs after the pool.

    The swap is exact. ReLU is monotone, so relu(max(x)) = max(relu(x)), and the gradient
    reaches the same element with the same value: where a window's maximum is positive both
    orders pick the same (first) argmax, and elsewhere both give zero. NaN inputs and non-finite
    gradients propagate in the same way. Two things differ:
    - a zero output may change sign;
    - a window holding -inf beside finite values gives its maximum and passes the gradient,
      where ReLU first would turn the -inf into NaN (docs/layers.md) and pass none.
    The ReLU then works on a map pool_size² times smaller, about a tenth of the benchmark CNN's
    step. Only the exact built-in classes are swapped, since a subclass may compute otherwise.
    """
    order = list(range(len(layers)))
    k = 0
    while k < len(layers) - 1:
        if type(layers[k]) is ReLU and type(layers[k + 1]) is MaxPool2D:
            order[k], order[k + 1] = k + 1, k
            k += 2
        else:
            k += 1
    return order
