"""What the recurrent layers share: the parameters W, U, b of ``gates`` blocks (and the GRU's
recurrent bias), the sequence kept time-major for the step loop, the output (every step's h, or
the last), and the gradients of the parameters and the input, each one matrix product over all
the steps once backward has the gates' errors; and what their CPU paths share (``gate_rows``,
``Workspace``)."""
from __future__ import annotations

import numpy as np

from .initializers import Initializer
from ..registry.options import PositiveInt
from ..losses.regularizers import Regularizer
from .base import InputSpec, Layer
from .linear import _init


class Recurrent(Layer):
    """Base of the layers that run a recurrence over the time axis of (N, T, features) input.

    A subclass sets ``gates`` (blocks of ``units`` rows in W, U and b) and defines ``steps``
    (the forward recurrence) and ``steps_backward`` (through time), both time-major: ``a``
    holds x_t Wᵀ + b for every step as (T, N, gates·units) and ``hs`` the states h_0 … h_T as
    (T + 1, N, units), h_0 = 0. ``steps_backward`` gets dL/dh_t for every step (T, N, units)
    and returns dL/da (T, N, gates·units), from which this class computes dW, db and dx.

    It computes dU (and the recurrent bias's gradient) from the errors of the recurrent terms
    u_t = h_{t−1}Uᵀ (+ b_u): dU = Σ_t du_tᵀ h_{t−1}. Where each step's pre-activation is
    a_t + u_t (SimpleRNN, LSTM) du = da, and ``steps_backward`` returns da alone; a recurrence
    that uses u_t otherwise (the GRU's candidate r ⊙ u_n) returns the pair (da, du). Returning
    da alone there gives a wrong dU, which ``dlrun gradcheck`` reports as a FAIL of ``recurrent``.

    ``LSTM``, ``GRU`` and ``SimpleRNN`` run this time-major path on the GPU (their fused kernels)
    and override ``forward`` and ``backward`` on the CPU with a features-first layout of their
    own (see dlrun.layers.lstm), where numpy makes one pass per gate instead of one per sample.
    """

    gates = 1
    recurrent_bias = False  # a second bias b_u inside the recurrent term (the GRU's, as PyTorch's)
    input_spec = InputSpec(shape=("T", "D"), options={"units": "C"})

    def __init__(self, units: PositiveInt, return_sequences: bool = False, use_bias: bool = True,
                 weight_initializer: Initializer = "xavier_uniform",
                 recurrent_initializer: Initializer = "orthogonal",
                 bias_initializer: Initializer = "zeros",
                 weight_regularizer: Regularizer | None = None,
                 recurrent_regularizer: Regularizer | None = None,
                 bias_regularizer: Regularizer | None = None):
        self.units = units
        self.return_sequences = return_sequences
        self.use_bias = use_bias
        self.weight_initializer = _init(weight_initializer)
        self.recurrent_initializer = _init(recurrent_initializer)
        self.bias_initializer = _init(bias_initializer)
        self.weight_regularizer = weight_regularizer
        self.recurrent_regularizer = recurrent_regularizer
        self.bias_regularizer = bias_regularizer

    def build(self, input_shape):
        self.expect_rank(input_shape, 2, "(N, steps, features) input (a sequence per sample; an Embedding "
                                         "gives one from (N, steps) indices)")
        _, d = input_shape
        rows = self.gates * self.units
        self.weight = self.add_param("weight", (rows, d), self.weight_initializer, fan_in=d, fan_out=rows,
                                     regularizer=self.weight_regularizer)
        self.recurrent = self.add_param("recurrent", (rows, self.units), self.recurrent_initializer,
                                        fan_in=self.units, fan_out=rows, regularizer=self.recurrent_regularizer)
        self.bias = self.u_bias = None
        if self.use_bias:
            self.bias = self.add_param("bias", (rows,), self.initial_bias(), fan_in=d, fan_out=rows,
                                       regularizer=self.bias_regularizer, regularize=False)
            if self.recurrent_bias:
                self.u_bias = self.add_param("recurrent_bias", (rows,), self.bias_initializer, fan_in=self.units,
                                             fan_out=rows, regularizer=self.bias_regularizer, regularize=False)
        return (input_shape[0], self.units) if self.return_sequences else (self.units,)

    def initial_bias(self):
        """The initializer of b (a subclass may set some gates' blocks, as LSTM's forget bias)."""
        return self.bias_initializer

    def forward(self, x, y=None):
        xp = self.xp
        n, steps, _ = x.shape
        self._xt = xt = xp.ascontiguousarray(x.transpose(1, 0, 2))  # time-major: each step's rows contiguous
        a = self.backend.matmul(xt, self.weight.data.T)  # every step's input projection in one product
        if self.bias is not None:
            a += self.bias.data
        self._hs = hs = xp.empty((steps + 1, n, self.units), dtype=x.dtype)
        hs[0] = 0
        self.steps(a, hs)
        if self.return_sequences:
            return xp.ascontiguousarray(hs[1:].transpose(1, 0, 2))
        return hs[steps].copy()

    def backward(self, dy):
        xp = self.xp
        steps, n, units = self._hs.shape[0] - 1, self._hs.shape[1], self.units
        if self.return_sequences:  # (a copy: steps_backward may write into it, and dy stays as given)
            dh = dy.transpose(1, 0, 2).copy()
        else:  # only h_T is an output
            dh = xp.zeros((steps, n, units), dtype=dy.dtype)
            dh[steps - 1] = dy
        errors = self.steps_backward(dh)
        da, du = errors if isinstance(errors, tuple) else (errors, errors)
        da2, du2 = da.reshape(steps * n, -1), du.reshape(steps * n, -1)
        self.backend.matmul(da2.T, self._xt.reshape(steps * n, -1), out=self.weight.grad)
        self.backend.matmul(du2.T, self._hs[:steps].reshape(steps * n, units), out=self.recurrent.grad)
        if self.bias is not None:
            da2.sum(axis=0, out=self.bias.grad)
        if self.u_bias is not None:
            du2.sum(axis=0, out=self.u_bias.grad)
        if not self.needs_input_grad:
            return None
        return xp.ascontiguousarray(self.backend.matmul(da, self.weight.data).transpose(1, 0, 2))

    def runs_fused(self, sequence, step, limit: int, dtype) -> bool:
        """Whether a layer's fused GPU kernels run it: the whole-sequence kernel ``sequence`` up to
        ``limit`` units, else the per-step cell ``step`` (each None off CuPy). Otherwise the layer
        takes its CPU path (numpy, or CuPy with the kernels turned off). The per-step cell is only
        asked for where the sequence kernel does not apply."""
        if self.units <= limit and sequence.on(self.xp, dtype) is not None:
            return True
        return step.on(self.xp) is not None

    def gate_rows(self, blocks: tuple[int, ...], inverse: bool = False):
        """Row indices that take W, U or b from PyTorch's gate order into ``blocks`` (PyTorch's
        block numbers, in the order wanted), or with ``inverse`` back: for a layer's CPU path."""
        h = self.units

        def make():
            rows = np.concatenate([np.arange(b * h, (b + 1) * h) for b in blocks])
            return self.xp.asarray(np.argsort(rows) if inverse else rows)
        return self.buffers.constant(self.xp, ("gate_rows", h, tuple(blocks), inverse), make)

    # The CPU paths keep a sequence features first: h_t is a (units, N) block, so each gate is
    # contiguous and every numpy call makes one pass. These convert at the layer's two ends.

    def outputs_of(self, hs):
        """The layer's output from h_1 … h_T kept features first, (T, units, N): (N, T, units) with
        return_sequences, else h_T as (N, units)."""
        if self.return_sequences:
            return self.xp.ascontiguousarray(hs.transpose(2, 0, 1))
        return self.xp.ascontiguousarray(hs[-1].T)

    def errors_into(self, e, dy) -> None:
        """Write the output's gradient ``dy`` into ``e``, the errors of h_1 … h_T features first
        (T, units, N); without return_sequences only h_T's (the others are what each h_t passes
        to step t + 1, added in the backward loop)."""
        if self.return_sequences:
            e[...] = dy.transpose(1, 2, 0)
        else:
            e[-1] = dy.T

    def stacked_gradients(self, da, xh, out, rows=None):
        """dW, db and dU from a batched product over the steps, for a step that multiplies
        [W | b | U] by the column [x_t; 1; h_{t−1}]: ``xh`` (T + 1, D + 1 + units, N) holds those columns (without
        the 1 when there is no bias; h_0 = 0, so the first step's product leaves out its h
        rows), ``da`` (T, rows, N) the gradient of the product, ``out`` (T, rows, D + 1 + units,
        C-contiguous) is scratch. Their sums over the steps are written into the parameters'
        grads; ``rows`` (:meth:`gate_rows` with ``inverse``) takes the rows from the layer's
        gate order back to PyTorch's."""
        xp, matmul = self.xp, self.backend.matmul
        steps, d, k = len(da), self.weight.grad.shape[1], xh.shape[1] - self.units
        # h_0 = 0 adds nothing to dU: the first step's product skips those columns
        matmul(da[1:], xh[1:steps].transpose(0, 2, 1), out=out[1:])
        matmul(da[0], xh[0, :k].T, out=out[0, :, :k])
        out[0, :, k:] = 0
        # the sum over the steps as one matrix-vector product (one BLAS pass; numpy's sum makes T)
        grads = matmul(self.buffers.ones(xp, steps, out.dtype), out.reshape(steps, -1)).reshape(out.shape[1:])
        parts = [(grads[:, :d], self.weight.grad), (grads[:, k:], self.recurrent.grad)]
        if self.bias is not None:
            parts.append((grads[:, d], self.bias.grad))
        for g, dst in parts:
            if rows is None:
                dst[...] = g
            else:
                xp.take(g, rows, axis=0, out=dst)

    def backward_workspace(self, key, forward, make):
        """The CPU path's backward arrays that ``make()`` builds for the forward arrays
        ``forward``: cached under ``key`` with them while the trainer owns the outputs, made
        afresh when the cached ones were made for other forward arrays."""
        b = self.buffers.group(key, make)
        return b if b.forward is forward else make()

    def steps(self, a, hs) -> None:  # pragma: no cover - abstract
        """Run the recurrence: from the input projections ``a`` write h_1 … h_T into ``hs``."""
        raise NotImplementedError

    def steps_backward(self, dh):  # pragma: no cover - abstract
        """dL/da (T, N, gates·units) from dL/dh_t of the outputs (T, N, units); or the pair
        (dL/da, dL/du) when the recurrent term u_t does not simply add to a_t (see the class)."""
        raise NotImplementedError


class Workspace:
    """The arrays of one batch shape on a recurrent layer's CPU path, and each step's views of
    them (made once: at these sizes a view costs about as much to make as a ufunc call)."""

    def __init__(self, **arrays):
        self.__dict__.update(arrays)
