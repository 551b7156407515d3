"""LSTM: long short-term memory over sequences, with a forget gate."""
from __future__ import annotations

import numpy as np

from ..backend import BlockKernel, Kernel
from .initializers import Initializer
from ..registry.options import PositiveInt
from ..registry import layers
from ..losses.regularizers import Regularizer
from .recurrent import Recurrent, Workspace

# On the GPU a time step is its recurrent product (cuBLAS) and one of these launches, where the
# ufunc path takes about ten each way. Thread i is unit i % H of sample i / H; the gates of a row
# sit H apart in PyTorch's order, i, f, g, o. The formulas are the CPU path's.
# Forward: z holds a_t = x_t Wᵀ + b and becomes the gates' activations (kept for backward), u is
# h_{t−1} Uᵀ; σ(a) = tanh(a/2)/2 + 1/2.
_STEP = Kernel("raw T u, T c_prev, int32 H", "raw T z, T c, T tc, T h", """
    const ptrdiff_t r = (i / H) * 4 * H + i % H;
    const T ig = tanh((z[r] + u[r]) * (T)0.5) * (T)0.5 + (T)0.5;
    const T fg = tanh((z[r + H] + u[r + H]) * (T)0.5) * (T)0.5 + (T)0.5;
    const T gg = tanh(z[r + 2 * H] + u[r + 2 * H]);
    const T og = tanh((z[r + 3 * H] + u[r + 3 * H]) * (T)0.5) * (T)0.5 + (T)0.5;
    z[r] = ig; z[r + H] = fg; z[r + 2 * H] = gg; z[r + 3 * H] = og;
    c = fg * c_prev + ig * gg;
    tc = tanh(c);
    h = og * tc;
""", "dlrun_lstm_step")
# Backward: dh + hd is the error of h_t (hd = da_{t+1} U, what h_t passed to the next step), dc
# the error of c_t coming in and of c_{t−1} going out, d the gates' da at the step.
_STEP_GRAD = Kernel("T dh, T hd, T tc, T c_prev, raw T z, int32 H", "T dc, raw T d", """
    const ptrdiff_t r = (i / H) * 4 * H + i % H;
    const T ig = z[r], fg = z[r + H], gg = z[r + 2 * H], og = z[r + 3 * H];
    const T e = dh + hd;
    d[r + 3 * H] = e * tc * (((T)1 - og) * og);
    const T dct = dc + e * og * ((T)1 - tc * tc);
    d[r] = dct * gg * (((T)1 - ig) * ig);
    d[r + H] = dct * c_prev * (((T)1 - fg) * fg);
    d[r + 2 * H] = dct * ig * (((T)1 - gg) * (gg + (T)1));
    dc = dct * fg;
""", "dlrun_lstm_step_grad")

# The whole sequence in one launch each way on the GPU, for up to SEQUENCE_UNITS units: block b
# runs sample b through every step, its threads over the gates' rows (forward) or the units
# (backward), h_{t−1} (or the next step's gate errors) in shared memory, the recurrent product
# summed in the kernel, one unit at a time, where the per-step path calls cuBLAS. Barriers: after
# the rows are summed (the reads of shared h or d end before they are overwritten) and after the
# new h or d is written (before the next step reads it). The arrays are C-contiguous, time-major:
# z (T, N, 4H) as in the per-step path, ut = Uᵀ (H, 4H) so that a warp reads consecutive rows,
# hs and cs (T + 1, N, H), tc (T, N, H). Above SEQUENCE_UNITS (shared memory, and a block holds
# the 4H rows), each step takes the kernels above.
SEQUENCE_UNITS = 256
_SEQUENCE = BlockKernel(f"#define LIMIT {SEQUENCE_UNITS}\n" + r"""
extern "C" __global__ void dlrun_lstm_sequence(T* z, const T* ut, T* hs, T* cs, T* tc,
                                               const int steps, const int n, const int H) {
    __shared__ T h[LIMIT];
    __shared__ T g[4 * LIMIT];
    const int G = 4 * H;
    const long long b = blockIdx.x;
    for (int k = threadIdx.x; k < H; k += blockDim.x) h[k] = hs[b * H + k];
    __syncthreads();
    for (int t = 0; t < steps; ++t) {
        T* zt = z + ((long long)t * n + b) * G;
        for (int j = threadIdx.x; j < G; j += blockDim.x) {
            T acc = 0;
            for (int k = 0; k < H; ++k) acc += ut[(long long)k * G + j] * h[k];
            g[j] = zt[j] + acc;
        }
        __syncthreads();
        const long long o = ((long long)t * n + b) * H, next = o + (long long)n * H;
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            const T ig = tanh(g[k] * (T)0.5) * (T)0.5 + (T)0.5;
            const T fg = tanh(g[k + H] * (T)0.5) * (T)0.5 + (T)0.5;
            const T gg = tanh(g[k + 2 * H]);
            const T og = tanh(g[k + 3 * H] * (T)0.5) * (T)0.5 + (T)0.5;
            zt[k] = ig; zt[k + H] = fg; zt[k + 2 * H] = gg; zt[k + 3 * H] = og;
            const T c = fg * cs[o + k] + ig * gg;
            const T tcv = tanh(c);
            const T hv = og * tcv;
            cs[next + k] = c; tc[o + k] = tcv; hs[next + k] = hv;
            h[k] = hv;
        }
        __syncthreads();
    }
}
""", "dlrun_lstm_sequence")
# Backward, t from T − 1 down to 0: e = dh_t + da_{t+1} U (U (4H, H): a warp reads consecutive
# units), then the step kernel's formulas; d holds da_{t+1} and becomes da_t, written to da
# (T, N, 4H) too; e and dc (the error of c, carried) are each thread's own units.
_SEQUENCE_GRAD = BlockKernel(f"#define LIMIT {SEQUENCE_UNITS}\n" + r"""
extern "C" __global__ void dlrun_lstm_sequence_grad(const T* dh, const T* u, const T* z, const T* cs,
                                                    const T* tc, T* da, const int steps, const int n,
                                                    const int H) {
    __shared__ T d[4 * LIMIT];
    __shared__ T e[LIMIT];
    __shared__ T dc[LIMIT];
    const int G = 4 * H;
    const long long b = blockIdx.x;
    for (int k = threadIdx.x; k < H; k += blockDim.x) dc[k] = 0;
    for (int t = steps - 1; t >= 0; --t) {
        const long long o = ((long long)t * n + b) * H;
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            T hd = 0;
            if (t < steps - 1)
                for (int j = 0; j < G; ++j) hd += d[j] * u[(long long)j * H + k];
            e[k] = dh[o + k] + hd;
        }
        __syncthreads();
        const T* zt = z + ((long long)t * n + b) * G;
        T* dt = da + ((long long)t * n + b) * G;
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            const T ig = zt[k], fg = zt[k + H], gg = zt[k + 2 * H], og = zt[k + 3 * H];
            const T tcv = tc[o + k], ek = e[k];
            const T dct = dc[k] + ek * og * ((T)1 - tcv * tcv);
            const T di = dct * gg * (((T)1 - ig) * ig);
            const T df = dct * cs[o + k] * (((T)1 - fg) * fg);
            const T dg = dct * ig * (((T)1 - gg) * (gg + (T)1));
            const T dout = ek * tcv * (((T)1 - og) * og);
            dc[k] = dct * fg;
            d[k] = di; d[k + H] = df; d[k + 2 * H] = dg; d[k + 3 * H] = dout;
            dt[k] = di; dt[k + H] = df; dt[k + 2 * H] = dg; dt[k + 3 * H] = dout;
        }
        __syncthreads();
    }
}
""", "dlrun_lstm_sequence_grad")


_ORDER = (3, 0, 1, 2)  # the CPU path's gate order, o, i, f, g, in PyTorch's block numbers


@layers.register("LSTM")
class LSTM(Recurrent):
    """i, f, g, o = σ, σ, tanh, σ of x_t Wᵀ + h_{t−1} Uᵀ + b; c_t = f ⊙ c_{t−1} + i ⊙ g; h_t = o ⊙ tanh(c_t).

    Hochreiter & Schmidhuber (1997) with the forget gate of Gers et al. (2000), as PyTorch's
    nn.LSTM and Keras' LSTM: W (4·units × features), U (4·units × units) and b (4·units) hold the
    gates in PyTorch's order, input, forget, cell, output; h_0 = c_0 = 0. Backward runs through
    time: with dc the error of c_t, do = dh ⊙ tanh c_t, dc += dh ⊙ o ⊙ (1 − tanh² c_t),
    di = dc ⊙ g, df = dc ⊙ c_{t−1}, dg = dc ⊙ i, dc_{t−1} = dc ⊙ f, each through its gate's
    derivative (σ' = σ(1 − σ), tanh' = 1 − tanh²), and dh_{t−1} = da_t U.

    Args:
        units: size of the hidden state h and the cell c (and of each output vector).
        return_sequences: output h_t for every step, (N, T, units), instead of h_T alone, (N, units).
        use_bias: add the bias b.
        weight_initializer: initializer for W (Keras' glorot_uniform).
        recurrent_initializer: initializer for U (orthogonal, as Keras).
        bias_initializer: initializer for b.
        unit_forget_bias: set the forget gate's bias to 1 at the start, so the cell keeps its
            content early in training (Jozefowicz et al. 2015; Keras' default).
        weight_regularizer: penalty on W (overrides the run-wide regularizer).
        recurrent_regularizer: penalty on U (overrides the run-wide regularizer).
        bias_regularizer: penalty on b (biases are otherwise not regularized).

    Shape:
        input (N, T, features) -> output (N, units), or (N, T, units) with return_sequences.

    Example:
        ``- {type: LSTM, units: 32}`` (after ``{type: Embedding, ...}`` for token sequences)
    """

    gates = 4

    def __init__(self, units: PositiveInt, return_sequences: bool = False, use_bias: bool = True,
                 weight_initializer: Initializer = "xavier_uniform",
                 recurrent_initializer: Initializer = "orthogonal",
                 bias_initializer: Initializer = "zeros", unit_forget_bias: bool = True,
                 weight_regularizer: Regularizer | None = None,
                 recurrent_regularizer: Regularizer | None = None,
                 bias_regularizer: Regularizer | None = None):
        super().__init__(units, return_sequences, use_bias, weight_initializer, recurrent_initializer,
                         bias_initializer, weight_regularizer, recurrent_regularizer, bias_regularizer)
        self.unit_forget_bias = unit_forget_bias

    def initial_bias(self):
        if not self.unit_forget_bias:
            return self.bias_initializer
        units, drawn = self.units, self.bias_initializer

        def forget_one(shape, fan_in, fan_out, rng):
            b = np.array(drawn(shape, fan_in, fan_out, rng), dtype=np.float64)
            b[units:2 * units] = 1.0
            return b
        return forget_one

    def steps(self, a, hs):
        xp, u, h = self.xp, self.recurrent.data, self.units
        self._gates = a  # the activated gates, in place of their arguments
        run = _SEQUENCE.on(xp, a.dtype) if h <= SEQUENCE_UNITS else None
        self._cs = cs = xp.empty_like(hs)
        cs[0] = 0
        self._tc = tc = xp.empty((len(a),) + hs.shape[1:], dtype=hs.dtype)
        if run is not None:  # GPU, small h: one launch for the whole sequence
            n = a.shape[1]
            run(n, 4 * h, a, xp.ascontiguousarray(u.T), hs, cs, tc, len(a), n, h)
            return
        step, ut, hu = _STEP.on(xp), u.T, xp.empty_like(a[0])  # two launches a step: product, cell
        for t in range(len(a)):
            step(self.backend.matmul(hs[t], ut, out=hu), cs[t], h, a[t], cs[t + 1], tc[t], hs[t + 1])

    def steps_backward(self, dh):
        xp, u, h = self.xp, self.recurrent.data, self.units
        run = _SEQUENCE_GRAD.on(xp, dh.dtype) if h <= SEQUENCE_UNITS else None
        gates, cs, tc = self._gates, self._cs, self._tc
        da = xp.empty_like(gates)
        if run is not None:  # GPU, small h: one launch, as forward
            n = dh.shape[1]
            run(n, h, xp.ascontiguousarray(dh), xp.ascontiguousarray(u), gates, cs, tc, da, len(dh), n, h)
            return da
        step, dc = _STEP_GRAD.on(xp), xp.zeros_like(dh[0])  # the product and the cell, as forward
        hd = xp.zeros_like(dh[0])  # nothing comes back from past the last step
        for t in range(len(dh) - 1, -1, -1):
            if t < len(dh) - 1:
                self.backend.matmul(da[t + 1], u, out=hd)
            step(dh[t], hd, tc[t], cs[t], gates[t], h, dc, da[t])
        return da

    # On the CPU (numpy) the layer keeps its own layout, features first: a step's gates are a
    # (4·units, N) block, so that each gate is a contiguous (units, N) block and each of numpy's
    # in-place ufuncs, whose per-call cost is as large as its arithmetic here, makes one pass
    # over it (a gate sliced from (N, 4·units) rows would be N short passes). Inside, the gates
    # are ordered o, i, f, g and followed by c_{t−1}: the σ gates side by side, and i, f beside
    # g, c_{t−1}, so that one product gives i ⊙ g and f ⊙ c_{t−1}. The σ gates' rows of W, U and
    # b are halved (exact in floating point): one tanh of the block then gives σ(a) = (1 + tanh(a/2))/2.
    # A step's product takes W, b and U at once, on the column [x_t; 1; h_{t−1}] (xh), and
    # after the loop one batched product over those columns gives dW, db and dU together.

    def forward(self, x, y=None):
        self._fused = self.runs_fused(_SEQUENCE, _STEP, SEQUENCE_UNITS, x.dtype)
        if self._fused:  # CuPy: the fused kernels on Recurrent's layout
            return super().forward(x)
        xp, h = self.xp, self.units
        n, steps, d = x.shape
        w = self._host(n, steps, d, x.dtype)
        k, wc, order = w.k, w.wc, self.gate_rows(_ORDER)
        w.xh[:steps, :d] = x.transpose(1, 2, 0)
        xp.take(self.weight.data, order, axis=0, out=wc[:, :d])
        if self.bias is not None:
            xp.take(self.bias.data, order, out=wc[:, d])
        xp.take(self.recurrent.data, order, axis=0, out=wc[:, k:])
        wc[:3 * h] *= 0.5
        matmul, tanh, multiply, add = self.backend.matmul, xp.tanh, xp.multiply, xp.add
        p, ig, fc = w.p, w.p[:h], w.p[h:]
        for t, (x_t, a, sg, i_f, g_c, c, tc, o, h_next) in enumerate(w.steps):
            if t:
                matmul(wc, x_t, out=a)
            else:  # h_0 = 0 adds nothing
                matmul(wc[:, :k], x_t[:k], out=a)
            tanh(a, out=a)
            sg *= 0.5
            sg += 0.5
            multiply(i_f, g_c, out=p)  # i ⊙ g, f ⊙ c_{t−1}
            multiply(o, tanh(add(fc, ig, out=c), out=tc), out=h_next)
        self._work = w
        return self.outputs_of(w.xh[1:, k:])

    def backward(self, dy):
        if self._fused:
            return super().backward(dy)
        xp, h, w = self.xp, self.units, self._work
        b = self._host_backward(w)
        z, tc, da, e = w.z[:-1, :4 * h], w.tc, b.da, b.dh
        sequences = self.return_sequences
        self.errors_into(e, dy)
        # what does not depend on the errors carried back, for every step at once: the gates'
        # derivatives (σ(1 − σ) on o, i, f; 1 − tanh² on g) and o_t ⊙ tanh'(c_t)
        dz = xp.subtract(1, z, out=b.dz)
        dz[:, :3 * h] *= z[:, :3 * h]
        dz[:, 3 * h:] *= xp.add(z[:, 3 * h:], 1, out=da[:, 3 * h:])
        q = xp.multiply(tc, tc, out=b.q)
        xp.subtract(1, q, out=q)
        q *= z[:, :h]
        ub = xp.take(self.recurrent.data, self.gate_rows(_ORDER), axis=0, out=b.ub).T
        matmul, multiply = self.backend.matmul, xp.multiply
        dc, eo, hd = b.dc, b.eo, b.hd
        dc[...] = 0
        for e_t, da_next, tc_t, q_t, g_c, i, f, d_o, d_if, d_g, dz_t, d in b.steps:
            if da_next is None:
                pass
            elif sequences:  # the error h_t passes to step t + 1, added to its own
                e_t += matmul(ub, da_next, out=hd)
            else:
                matmul(ub, da_next, out=e_t)
            multiply(e_t, tc_t, out=d_o)
            dc += multiply(e_t, q_t, out=eo)
            multiply(dc, g_c, out=d_if)  # di = dc ⊙ g, df = dc ⊙ c_{t−1}
            multiply(dc, i, out=d_g)  # dg = dc ⊙ i
            dc *= f
            d *= dz_t
        # dW, db and dU: the sum over the steps of da_t [x_t; 1; h_{t−1}]ᵀ, in PyTorch's gate order
        self.stacked_gradients(da, w.xh, b.grads, self.gate_rows(_ORDER, inverse=True))
        if not self.needs_input_grad:
            return None
        dx = matmul(xp.take(self.weight.data, self.gate_rows(_ORDER), axis=0).T, da)  # (T, D, N)
        return xp.ascontiguousarray(dx.transpose(2, 0, 1))

    def _host(self, n: int, steps: int, d: int, dtype):
        """The CPU path's forward arrays for N sequences of T steps of D features, and each
        step's views of them (one set per shape, reused across batches while the trainer owns
        the outputs; a view costs about as much to make as a ufunc call here)."""
        xp, h = self.xp, self.units
        k = d + (self.bias is not None)

        def make():
            w = Workspace(k=k)
            w.xh = xh = xp.zeros((steps + 1, k + h, n), dtype)  # [x_t; 1; h_{t−1}], h_T in the last
            xh[:steps, d:k] = 1
            w.wc = xp.empty((4 * h, k + h), dtype)  # [W | b | U], o, i, f, g, σ rows halved
            w.z = z = xp.zeros((steps + 1, 5 * h, n), dtype)  # o, i, f, g, c_{t−1} (c_T in the last)
            w.tc, w.p = xp.empty((steps, h, n), dtype), xp.empty((2 * h, n), dtype)
            w.steps = [(xh[t], z[t, :4 * h], z[t, :3 * h], z[t, h:3 * h], z[t, 3 * h:], z[t + 1, 4 * h:], w.tc[t],
                        z[t, :h], xh[t + 1, k:]) for t in range(steps)]
            return w
        return self.buffers.group(("lstm", n, steps, d, dtype), make)

    def _host_backward(self, w):
        """The CPU path's backward arrays and each step's views, latest step first, as ``_host``."""
        xp, h = self.xp, self.units
        steps, _, n = w.tc.shape
        dtype = w.tc.dtype

        def make():
            b = Workspace(forward=w)
            b.da, b.dz = xp.empty((steps, 4 * h, n), dtype), xp.empty((steps, 4 * h, n), dtype)
            b.dh, b.q = xp.empty((steps, h, n), dtype), xp.empty((steps, h, n), dtype)
            b.ub = xp.empty((4 * h, h), dtype)
            b.dc, b.eo, b.hd = (xp.empty((h, n), dtype) for _ in range(3))
            b.grads = xp.empty((steps, 4 * h, w.k + h), dtype)
            z, da = w.z, b.da
            b.steps = [(b.dh[t], da[t + 1] if t < steps - 1 else None, w.tc[t], b.q[t], z[t, 3 * h:].reshape(2, h, n),
                        z[t, h:2 * h], z[t, 2 * h:3 * h], da[t, :h], da[t, h:3 * h].reshape(2, h, n), da[t, 3 * h:],
                        b.dz[t], da[t]) for t in range(steps - 1, -1, -1)]
            return b
        return self.backward_workspace(("lstm_backward", n, steps, w.k, dtype), w, make)
