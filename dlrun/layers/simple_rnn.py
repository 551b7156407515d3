"""SimpleRNN: the Elman recurrence h_t = tanh(x_t Wᵀ + h_{t−1} Uᵀ + b)."""
from __future__ import annotations

from ..backend import Kernel
from ..registry import layers
from .recurrent import Recurrent

# On the GPU a time step is its recurrent product (cuBLAS) and one of these launches (the ufunc
# path takes two forward and three backward); hd = da_{t+1} U, what h_t passed to the next step.
_STEP = Kernel("T a, T u", "T h", "h = tanh(a + u);", "dlrun_rnn_step")
_STEP_GRAD = Kernel("T dh, T hd, T h", "T d", "d = ((T)1 - h * h) * (dh + hd);", "dlrun_rnn_step_grad")


@layers.register()
class SimpleRNN(Recurrent):
    """h_t = tanh(x_t Wᵀ + h_{t−1} Uᵀ + b), h_0 = 0, over the steps of each sequence (Elman 1990).

    As Keras' SimpleRNN and PyTorch's nn.RNN (tanh). Backward runs through time:
    dL/da_t = (dL/dh_t + dL/da_{t+1} U) ⊙ (1 − h_t²), and dW, dU, db sum over the steps.
    W is (units × features), U (units × units), b (units).

    Args:
        units: size of the hidden state h (and of each output vector).
        return_sequences: output h_t for every step, (N, T, units), instead of h_T alone, (N, units).
        use_bias: add the bias b.
        weight_initializer: initializer for W (Keras' glorot_uniform).
        recurrent_initializer: initializer for U (orthogonal, as Keras).
        bias_initializer: initializer for b.
        weight_regularizer: penalty on W (overrides the run-wide regularizer).
        recurrent_regularizer: penalty on U (overrides the run-wide regularizer).
        bias_regularizer: penalty on b (biases are otherwise not regularized).

    Shape:
        input (N, T, features) -> output (N, units), or (N, T, units) with return_sequences.

    Example:
        ``- {type: SimpleRNN, units: 32}``
    """

    gates = 1

    def steps(self, a, hs):
        xp, u = self.xp, self.recurrent.data
        step = _STEP.on(xp)
        if step is not None:  # GPU: two launches a step, the product and the cell
            ut, hu = u.T, xp.empty_like(a[0])
            for t in range(len(a)):
                step(a[t], self.backend.matmul(hs[t], ut, out=hu), hs[t + 1])
            return
        for t in range(len(a)):
            z = a[t]
            z += self.backend.matmul(hs[t], u.T)
            xp.tanh(z, out=hs[t + 1])

    def steps_backward(self, dh):
        xp, u, hs = self.xp, self.recurrent.data, self._hs
        da = xp.empty_like(dh)
        step = _STEP_GRAD.on(xp)
        if step is not None:  # GPU: the product and the cell, as forward
            hd = xp.zeros_like(dh[0])  # nothing comes back from past the last step
            for t in range(len(dh) - 1, -1, -1):
                if t < len(dh) - 1:
                    self.backend.matmul(da[t + 1], u, out=hd)
                step(dh[t], hd, hs[t + 1], da[t])
            return da
        for t in range(len(dh) - 1, -1, -1):
            d = da[t]
            if t < len(dh) - 1:  # the error h_t passes to h_{t+1}
                dh[t] += self.backend.matmul(da[t + 1], u)
            xp.multiply(hs[t + 1], hs[t + 1], out=d)
            xp.subtract(1, d, out=d)
            d *= dh[t]
        return da
