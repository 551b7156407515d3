"""Embedding: a lookup table of learned vectors indexed by integer tokens."""
from __future__ import annotations

import numpy as np

from ..backend import Kernel, array_module
from ..errors import DataError
from .initializers import Initializer
from ..registry.options import PositiveInt
from ..losses.regularizers import Regularizer
from ..registry import layers
from .base import InputSpec, Layer
from .linear import _init


# GPU kernels of the unchecked lookup. In range: an index the table has (x may be a float
# holding a whole number, truncated like astype; NaN fails both comparisons). c: the column.
_IN_RANGE = "((double)x > -1.0 && (double)x < (double)D)"  # in double: unsigned X, float32 X with D > 2^24
_GATHER = Kernel("raw T W, X x, int64 c, int64 D, int64 C, T nan", "T y",
                 f"y = {_IN_RANGE} ? W[(long long)x * C + c] : nan;", "dlrun_embedding")
_SCATTER = Kernel("X x, int64 c, T dy, int64 D, int64 C", "raw T G",
                  f"if ({_IN_RANGE}) atomicAdd(&G[(long long)x * C + c], dy);", "dlrun_embedding_grad")


@layers.register()
class Embedding(Layer):
    """y[n, t] = W[x[n, t]]: row x of the table W (input_dim × output_dim) for each index x.

    ∂L/∂W[v] = Σ_{(n,t): x[n,t] = v} dy[n, t] (a scatter-add: repeated indices accumulate).

    Inputs are integer indices in [0, input_dim). Models carry data as floating-point arrays, so
    the indices may arrive as floats holding whole numbers; they are cast to integers here. The
    input is not differentiable: backward returns zeros for it.

    An index outside the table is a DataError naming it. In the GPU training loop that check
    would read the batch's extremes back to the host on every batch, so there the lookup is one
    kernel that gives NaN rows for such indices (and backward skips them): the epoch's loss turns
    NaN, and the end-of-epoch check replays the epoch with the checking lookup, which raises the
    DataError; the model keeps the previous epoch's weights.

    Args:
        input_dim: vocabulary size (number of rows of W).
        output_dim: length of each embedding vector.
        weight_initializer: initializer for W (default U[-0.05, 0.05], as in Keras).
        weight_regularizer: penalty on W (overrides the run-wide regularizer).

    Shape:
        input (N, *s) of indices -> output (N, *s, output_dim); e.g. (N, T) -> (N, T, output_dim).

    Example:
        ``- {type: Embedding, input_dim: 1000, output_dim: 16}``
    """

    input_spec = InputSpec(shape=("T",), kind="index", high="D", options={"input_dim": "D", "output_dim": "C"})

    # evaluation takes the checking lookup, which reads the batch's index range back to name an
    # index outside the table: no CUDA graph can hold that read
    capturable_in_evaluation = False

    def __init__(self, input_dim: PositiveInt, output_dim: PositiveInt,
                 weight_initializer: Initializer = "uniform",
                 weight_regularizer: Regularizer | None = None):
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.weight_initializer = _init(weight_initializer)
        self.weight_regularizer = weight_regularizer

    def build(self, input_shape):
        self.weight = self.add_param("weight", (self.input_dim, self.output_dim), self.weight_initializer,
                                     fan_in=self.input_dim, fan_out=self.output_dim,
                                     regularizer=self.weight_regularizer)
        return tuple(input_shape) + (self.output_dim,)

    def forward(self, x, y=None):
        xp = self.xp
        gather = _GATHER.on(xp)
        if gather is not None and self.buffers.enabled:  # GPU training loop: no host read per batch
            self._x, self._idx = x, None
            self._xshape, self._xdtype = x.shape, x.dtype  # backward's dx when an earlier layer trains
            out = self.output_array("y", x.shape + (self.output_dim,), self.weight.data.dtype)
            return gather(self.weight.data, x[..., None], self._columns(), self.input_dim, self.output_dim,
                          float("nan"), out)
        idx = x.astype(xp.int64) if x.dtype.kind != "i" else x
        if idx.size:  # (on the GPU one read of both ends, not two: evaluation runs here per batch)
            ends = (idx.min(), idx.max())
            lo, hi = (int(v) for v in (ends if xp is np else self.backend.to_host(xp.stack(ends))))
            if lo < 0 or hi >= self.input_dim:
                bad = lo if lo < 0 else hi
                raise DataError(f"Embedding: index {bad} is outside [0, {self.input_dim}); "
                                f"raise input_dim or check the data")
        self._idx = idx
        self._xshape, self._xdtype = x.shape, x.dtype
        return self.weight.data[idx]

    def backward(self, dy):
        g = self.weight.grad
        g.fill(0)
        if self._idx is None:  # the unchecked GPU forward: out-of-range indices add nothing
            _SCATTER.on(self.xp)(self._x[..., None], self._columns(), dy, self.input_dim, self.output_dim, g)
        else:
            self.backend.scatter_add(g, self._idx.reshape(-1), dy.reshape(-1, self.output_dim))
        if not self.needs_input_grad:
            return None
        return self.xp.zeros(self._xshape, dtype=self._xdtype)

    def _columns(self):
        """0..output_dim−1 on the device, made once: the kernels' column of each output element."""
        cols = getattr(self, "_cols", None)
        if cols is None or array_module(cols) is not self.xp:
            cols = self._cols = self.xp.arange(self.output_dim, dtype=self.xp.int64)
        return cols

    def __repr__(self) -> str:
        return f"Embedding(input_dim={self.input_dim}, output_dim={self.output_dim})"
