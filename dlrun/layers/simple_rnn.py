"""SimpleRNN: the Elman recurrence h_t = tanh(x_t Wᵀ + h_{t−1} Uᵀ + b)."""
from __future__ import annotations

from ..backend import BlockKernel, Kernel
from ..registry import layers
from .recurrent import Recurrent

# On the GPU a time step is its recurrent product (cuBLAS) and one of these launches (the ufunc
# path takes two forward and three backward); hd = da_{t+1} U, what h_t passed to the next step.
_STEP = Kernel("T a, T u", "T h", "h = tanh(a + u);", "dlrun_rnn_step")
_STEP_GRAD = Kernel("T dh, T hd, T h", "T d", "d = ((T)1 - h * h) * (dh + hd);", "dlrun_rnn_step_grad")
# The whole sequence in one launch each way on the GPU, for up to SEQUENCE_UNITS units, as the
# LSTM's (dlrun.layers.lstm): block b runs sample b through every step, its threads over the
# units, h_{t−1} (or the next step's error) in shared memory, the recurrent product summed in the
# kernel; a barrier after the sums and after the new h or d is written. a = x_t Wᵀ + b and da
# (T, N, H), hs (T + 1, N, H), time-major and C-contiguous; ut = Uᵀ forward and U backward, so
# that a warp reads consecutive units. Above SEQUENCE_UNITS each step takes the kernels above.
SEQUENCE_UNITS = 256
_SEQUENCE = BlockKernel(f"#define LIMIT {SEQUENCE_UNITS}\n" + r"""
extern "C" __global__ void dlrun_rnn_sequence(const T* a, const T* ut, T* hs, const int steps, const int n,
                                              const int H) {
    __shared__ T h[LIMIT];
    __shared__ T g[LIMIT];
    const long long b = blockIdx.x;
    for (int k = threadIdx.x; k < H; k += blockDim.x) h[k] = hs[b * H + k];
    __syncthreads();
    for (int t = 0; t < steps; ++t) {
        const long long o = ((long long)t * n + b) * H, next = o + (long long)n * H;
        for (int j = threadIdx.x; j < H; j += blockDim.x) {
            T acc = 0;
            for (int k = 0; k < H; ++k) acc += ut[(long long)k * H + j] * h[k];
            g[j] = tanh(a[o + j] + acc);
        }
        __syncthreads();
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            hs[next + k] = g[k];
            h[k] = g[k];
        }
        __syncthreads();
    }
}
""", "dlrun_rnn_sequence")
_SEQUENCE_GRAD = BlockKernel(f"#define LIMIT {SEQUENCE_UNITS}\n" + r"""
extern "C" __global__ void dlrun_rnn_sequence_grad(const T* dh, const T* u, const T* hs, T* da, const int steps,
                                                   const int n, const int H) {
    __shared__ T d[LIMIT];
    __shared__ T e[LIMIT];
    const long long b = blockIdx.x;
    for (int t = steps - 1; t >= 0; --t) {
        const long long o = ((long long)t * n + b) * H, next = o + (long long)n * H;
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            T hd = 0;
            if (t < steps - 1)
                for (int j = 0; j < H; ++j) hd += d[j] * u[(long long)j * H + k];
            const T hv = hs[next + k];
            e[k] = ((T)1 - hv * hv) * (dh[o + k] + hd);
        }
        __syncthreads();
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            d[k] = e[k];
            da[o + k] = e[k];
        }
        __syncthreads();
    }
}
""", "dlrun_rnn_sequence_grad")


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
        h = self.units
        run = _SEQUENCE.on(xp, a.dtype) if h <= SEQUENCE_UNITS else None
        if run is not None:  # GPU, small h: one launch for the whole sequence
            n = a.shape[1]
            run(n, h, xp.ascontiguousarray(a), xp.ascontiguousarray(u.T), hs, len(a), n, h)
            return
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
        h = self.units
        run = _SEQUENCE_GRAD.on(xp, dh.dtype) if h <= SEQUENCE_UNITS else None
        if run is not None:  # GPU, small h: one launch, as forward
            n = dh.shape[1]
            run(n, h, xp.ascontiguousarray(dh), xp.ascontiguousarray(u), hs, da, len(dh), n, h)
            return da
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
