"""SimpleRNN: the Elman recurrence h_t = tanh(x_t Wᵀ + h_{t−1} Uᵀ + b)."""
from __future__ import annotations

from ..backend import BlockKernel, Kernel
from ..registry import layers
from .recurrent import Recurrent, Workspace

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
        step, ut, hu = _STEP.on(xp), u.T, xp.empty_like(a[0])  # two launches a step: product, cell
        for t in range(len(a)):
            step(a[t], self.backend.matmul(hs[t], ut, out=hu), hs[t + 1])

    def steps_backward(self, dh):
        xp, u, hs = self.xp, self.recurrent.data, self._hs
        da = xp.empty_like(dh)
        h = self.units
        run = _SEQUENCE_GRAD.on(xp, dh.dtype) if h <= SEQUENCE_UNITS else None
        if run is not None:  # GPU, small h: one launch, as forward
            n = dh.shape[1]
            run(n, h, xp.ascontiguousarray(dh), xp.ascontiguousarray(u), hs, da, len(dh), n, h)
            return da
        step = _STEP_GRAD.on(xp)  # the product and the cell, as forward
        hd = xp.zeros_like(dh[0])  # nothing comes back from past the last step
        for t in range(len(dh) - 1, -1, -1):
            if t < len(dh) - 1:
                self.backend.matmul(da[t + 1], u, out=hd)
            step(dh[t], hd, hs[t + 1], da[t])
        return da

    # On the CPU (numpy) the layer keeps its own layout, features first, as the LSTM's (see
    # dlrun.layers.lstm): a step is one product of [W | b | U] with the column [x_t; 1; h_{t−1}]
    # written straight into h_t's place and one tanh there; backward, one product and one or
    # two calls, with 1 − h_t² for every step at once before its loop, and dW, db, dU together
    # from one batched product after it.

    def forward(self, x, y=None):
        self._fused = self.runs_fused(_SEQUENCE, _STEP, SEQUENCE_UNITS, x.dtype)
        if self._fused:  # CuPy: the fused kernels on Recurrent's layout
            return super().forward(x)
        xp = self.xp
        n, steps, d = x.shape
        w = self._host(n, steps, d, x.dtype)
        k, wc = w.k, w.wc
        w.xh[:steps, :d] = x.transpose(1, 2, 0)
        wc[:, :d] = self.weight.data
        if self.bias is not None:
            wc[:, d] = self.bias.data
        wc[:, k:] = self.recurrent.data
        matmul, tanh = self.backend.matmul, xp.tanh
        for t, (x_t, h_next) in enumerate(w.steps):
            if t:
                matmul(wc, x_t, out=h_next)
            else:  # h_0 = 0 adds nothing
                matmul(wc[:, :k], x_t[:k], out=h_next)
            tanh(h_next, out=h_next)
        self._work = w
        return self.outputs_of(w.xh[1:, k:])

    def backward(self, dy):
        if self._fused:
            return super().backward(dy)
        xp, w = self.xp, self._work
        b = self._host_backward(w)
        e, da = b.dh, b.da
        sequences = self.return_sequences
        self.errors_into(e, dy)
        hs = w.xh[1:, w.k:]
        q = xp.multiply(hs, hs, out=b.q)
        xp.subtract(1, q, out=q)  # tanh' for every step
        matmul, multiply = self.backend.matmul, xp.multiply
        ut, hd = self.recurrent.data.T, b.hd
        for e_t, da_next, q_t, da_t in b.steps:
            if da_next is not None:  # the error h_t passes to step t + 1
                if sequences:
                    e_t += matmul(ut, da_next, out=hd)
                else:
                    matmul(ut, da_next, out=e_t)
            multiply(e_t, q_t, out=da_t)
        # dW, db and dU: the sum over the steps of da_t [x_t; 1; h_{t−1}]ᵀ
        self.stacked_gradients(da, w.xh, b.grads)
        if not self.needs_input_grad:
            return None
        dx = matmul(self.weight.data.T, da)  # (T, D, N)
        return xp.ascontiguousarray(dx.transpose(2, 0, 1))

    def _host(self, n: int, steps: int, d: int, dtype):
        """The CPU path's forward arrays for N sequences of T steps of D features and each step's
        views (one set per shape, reused across batches while the trainer owns the outputs)."""
        xp, h = self.xp, self.units
        k = d + (self.bias is not None)

        def make():
            xh = xp.zeros((steps + 1, k + h, n), dtype)  # [x_t; 1; h_{t−1}], h_T in the last
            xh[:steps, d:k] = 1
            return Workspace(k=k, xh=xh, wc=xp.empty((h, k + h), dtype),
                             steps=[(xh[t], xh[t + 1, k:]) for t in range(steps)])
        return self.buffers.group(("rnn", n, steps, d, dtype), make)

    def _host_backward(self, w):
        """The CPU path's backward arrays and each step's views, latest step first, as ``_host``."""
        xp, h = self.xp, self.units
        steps, n = w.xh.shape[0] - 1, w.xh.shape[2]
        dtype = w.xh.dtype

        def make():
            dh, da, q = (xp.empty((steps, h, n), dtype) for _ in range(3))
            return Workspace(forward=w, dh=dh, da=da, q=q, hd=xp.empty((h, n), dtype),
                             grads=xp.empty((steps, h, w.xh.shape[1]), dtype),
                             steps=[(dh[t], da[t + 1] if t < steps - 1 else None, q[t], da[t])
                                    for t in range(steps - 1, -1, -1)])
        return self.backward_workspace(("rnn_backward", n, steps, dtype), w, make)
