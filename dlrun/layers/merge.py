"""Add, Concatenate and Multiply: the layers that merge several inputs into one."""
from __future__ import annotations

from ..errors import ShapeError
from ..registry import layers
from .base import InputSpec, Layer


def _same_shapes(layer, shapes) -> tuple[int, ...]:
    """The one per-sample shape every input has, or a ShapeError naming them all."""
    if len(set(map(tuple, shapes))) != 1:
        raise ShapeError(f"{type(layer).__name__} needs inputs of one shape, got "
                         f"{' and '.join(str(tuple(s)) for s in shapes)}")
    return tuple(shapes[0])


@layers.register()
class Add(Layer):
    """y = x₁ + x₂ + … (inputs of one shape); ∂L/∂xᵢ = ∂L/∂y for every input.

    The merge of a ``Residual`` block and of ``Parallel`` with ``merge: add``; in a graph, name
    its inputs: ``{type: Add, inputs: [a, b]}``.

    Shape:
        inputs (N, *s), (N, *s), ... -> output (N, *s).
    """

    num_inputs = None
    input_spec = InputSpec(inputs=(("C", "D"), ("C", "D")))

    def build(self, *input_shapes):
        self._n = len(input_shapes)
        return _same_shapes(self, input_shapes)

    def forward(self, *xs):
        y = xs[0] + xs[1]
        for x in xs[2:]:
            y += x
        return y

    def backward(self, dy):
        return (dy,) * self._n


@layers.register()
class Multiply(Layer):
    """y = x₁ ⊙ x₂ ⊙ … (elementwise, inputs of one shape); ∂L/∂xᵢ = ∂L/∂y ⊙ ∏_{j≠i} xⱼ.

    A gate: ``{type: Multiply, inputs: [values, gate]}`` with a Sigmoid before ``gate``.
    (Not ``MultiplyByTwo``, which doubles its one input.)

    Shape:
        inputs (N, *s), (N, *s), ... -> output (N, *s).
    """

    num_inputs = None
    input_spec = InputSpec(inputs=(("C", "D"), ("C", "D")))

    def build(self, *input_shapes):
        return _same_shapes(self, input_shapes)

    def forward(self, *xs):
        self._xs = xs
        y = xs[0] * xs[1]
        for x in xs[2:]:
            y *= x
        return y

    def backward(self, dy):
        xs = self._xs
        grads = []
        for i in range(len(xs)):
            g = dy
            for j, x in enumerate(xs):
                if j != i:
                    g = g * x
            grads.append(g)
        return tuple(grads)


@layers.register()
class Concatenate(Layer):
    """y = [x₁, x₂, …] joined along per-sample ``axis``; ∂L/∂xᵢ is the slice of ∂L/∂y that xᵢ gave.

    The merge of ``Parallel`` with ``merge: concat`` (Inception, U-Net skips, DenseNet).

    Args:
        axis: the per-sample axis to join along, not counting the batch axis: 0 joins the
            features of (N, D) inputs and the channels of (N, C, H, W) inputs; -1 is the last
            axis. (Keras' ``axis=-1`` and PyTorch's ``torch.cat(dim=1)`` count the batch axis:
            dlrun's ``axis: 0`` is PyTorch's ``dim=1``.)

    Shape:
        inputs (N, *s₁), (N, *s₂), ... that agree on every axis but ``axis`` -> output whose
        ``axis`` is the sum of theirs.
    """

    num_inputs = None
    input_spec = InputSpec(inputs=(("C", "H"), ("D", "H")))

    def __init__(self, axis: int = 0):
        self.axis = axis

    def build(self, *input_shapes):
        shapes = [tuple(s) for s in input_shapes]
        rank = len(shapes[0])
        if any(len(s) != rank for s in shapes) or not -rank <= self.axis < rank:
            raise ShapeError(f"Concatenate(axis={self.axis}) needs inputs of one rank with that axis, got "
                             f"{' and '.join(map(str, shapes))}")
        a = self.axis % rank
        rest = {s[:a] + s[a + 1:] for s in shapes}
        if len(rest) != 1:
            raise ShapeError(f"Concatenate(axis={self.axis}) needs inputs that agree on every other axis, got "
                             f"{' and '.join(map(str, shapes))}")
        self._a = a + 1  # the axis with the batch axis in front
        sizes = [s[a] for s in shapes]
        self._bounds = [sum(sizes[:i]) for i in range(1, len(sizes))]
        return shapes[0][:a] + (sum(sizes),) + shapes[0][a + 1:]

    def forward(self, *xs):
        return self.xp.concatenate(xs, axis=self._a)

    def backward(self, dy):
        return tuple(self.xp.split(dy, self._bounds, axis=self._a))

    def __repr__(self) -> str:
        return f"Concatenate(axis={self.axis})"
