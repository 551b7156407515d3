"""GRU: the gated recurrent unit, as PyTorch's nn.GRU (the reset gate after the recurrent product)."""
from __future__ import annotations

from ..backend import BlockKernel, Kernel
from ..registry import layers
from .recurrent import Recurrent

# On the GPU a time step is its recurrent product (cuBLAS) and one of these launches, where the
# ufunc path takes about ten each way. Thread i is unit i % H of sample i / H; the gates of a row
# sit H apart in PyTorch's order, r, z, n. The formulas are the CPU path's, in its order.
# Forward: z holds a_t = x_t Wᵀ + b and becomes the gates' activations, u holds h_{t−1} Uᵀ and
# gets b_u added (both kept for backward); σ(a) = (1 + tanh(a/2))/2.
_STEP = Kernel("raw T ub, T h_prev, int32 H", "raw T z, raw T u, T h", """
    const ptrdiff_t j = i % H, r = (i / H) * 3 * H + j;
    const T ur = u[r] + ub[j], uz = u[r + H] + ub[j + H], un = u[r + 2 * H] + ub[j + 2 * H];
    u[r] = ur; u[r + H] = uz; u[r + 2 * H] = un;
    const T rg = (tanh((z[r] + ur) * (T)0.5) + (T)1) * (T)0.5;
    const T zg = (tanh((z[r + H] + uz) * (T)0.5) + (T)1) * (T)0.5;
    const T ng = tanh(z[r + 2 * H] + rg * un);
    z[r] = rg; z[r + H] = zg; z[r + 2 * H] = ng;
    h = (h_prev - ng) * zg + ng;
""", "dlrun_gru_step")
# Backward: the error of h_t is dh + carry + hd (carry = the error of h_{t+1} ⊙ z_{t+1}, and
# hd = du_{t+1} U, what h_t passed to the next step); carry leaves with this step's; d and e get
# the step's da and du.
_STEP_GRAD = Kernel("T dh, T hd, T h_prev, raw T g, raw T u, int32 H", "T carry, raw T d, raw T e", """
    const ptrdiff_t r = (i / H) * 3 * H + i % H;
    const T rg = g[r], zg = g[r + H], ng = g[r + 2 * H];
    const T dht = dh + carry + hd;
    const T dn = ((T)1 - zg) * dht * ((T)1 - ng * ng);
    const T dr = dn * u[r + 2 * H] * (rg * ((T)1 - rg));
    const T dz = (h_prev - ng) * dht * (zg * ((T)1 - zg));
    d[r] = dr; d[r + H] = dz; d[r + 2 * H] = dn;
    e[r] = dr; e[r + H] = dz; e[r + 2 * H] = dn * rg;
    carry = dht * zg;
""", "dlrun_gru_step_grad")
# The whole sequence in one launch each way on the GPU, for up to SEQUENCE_UNITS units, as the
# LSTM's (dlrun.layers.lstm): block b runs sample b through every step, its threads over the
# gates' rows (forward) or the units (backward), h_{t−1} (or the next step's du) in shared memory,
# the recurrent product summed in the kernel; a barrier after the sums and after the new h or du
# is written. z, u (us: the recurrent terms, kept), da, du (T, N, 3H) and hs (T + 1, N, H) as
# above, time-major and C-contiguous; ut = Uᵀ (H, 3H) so that a warp reads consecutive rows, U
# (3H, H) backward so that it reads consecutive units; ub is b_u (zeros without biases). Above
# SEQUENCE_UNITS each step takes the kernels above.
SEQUENCE_UNITS = 256
_SEQUENCE = BlockKernel(f"#define LIMIT {SEQUENCE_UNITS}\n" + r"""
extern "C" __global__ void dlrun_gru_sequence(T* z, T* u, const T* ut, const T* ub, T* hs, const int steps,
                                              const int n, const int H) {
    __shared__ T h[LIMIT];
    __shared__ T g[3 * LIMIT];
    const int G = 3 * H;
    const long long b = blockIdx.x;
    for (int k = threadIdx.x; k < H; k += blockDim.x) h[k] = hs[b * H + k];
    __syncthreads();
    for (int t = 0; t < steps; ++t) {
        T* zt = z + ((long long)t * n + b) * G;
        T* us = u + ((long long)t * n + b) * G;
        for (int j = threadIdx.x; j < G; j += blockDim.x) {
            T acc = 0;
            for (int k = 0; k < H; ++k) acc += ut[(long long)k * G + j] * h[k];
            const T uj = acc + ub[j];
            us[j] = uj;
            g[j] = uj;
        }
        __syncthreads();
        const long long next = ((long long)(t + 1) * n + b) * H;
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            const T ur = g[k], uz = g[k + H], un = g[k + 2 * H];
            const T rg = (tanh((zt[k] + ur) * (T)0.5) + (T)1) * (T)0.5;
            const T zg = (tanh((zt[k + H] + uz) * (T)0.5) + (T)1) * (T)0.5;
            const T ng = tanh(zt[k + 2 * H] + rg * un);
            zt[k] = rg; zt[k + H] = zg; zt[k + 2 * H] = ng;
            const T hv = (h[k] - ng) * zg + ng;
            hs[next + k] = hv;
            h[k] = hv;
        }
        __syncthreads();
    }
}
""", "dlrun_gru_sequence")
# Backward, t from T − 1 down to 0: the error of h_t is dh + carry + hd (carry = the error of
# h_{t+1} ⊙ z_{t+1}, each thread's own units; hd = du_{t+1} U from shared e), then the step
# kernel's formulas; e becomes du_t.
_SEQUENCE_GRAD = BlockKernel(f"#define LIMIT {SEQUENCE_UNITS}\n" + r"""
extern "C" __global__ void dlrun_gru_sequence_grad(const T* dh, const T* uw, const T* hs, const T* g, const T* u,
                                                   T* da, T* du, const int steps, const int n, const int H) {
    __shared__ T e[3 * LIMIT];
    __shared__ T err[LIMIT];
    __shared__ T carry[LIMIT];
    const int G = 3 * H;
    const long long b = blockIdx.x;
    for (int k = threadIdx.x; k < H; k += blockDim.x) carry[k] = 0;
    for (int t = steps - 1; t >= 0; --t) {
        const long long o = ((long long)t * n + b) * H, r0 = ((long long)t * n + b) * G;
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            T hd = 0;
            if (t < steps - 1)
                for (int j = 0; j < G; ++j) hd += e[j] * uw[(long long)j * H + k];
            err[k] = dh[o + k] + carry[k] + hd;
        }
        __syncthreads();
        for (int k = threadIdx.x; k < H; k += blockDim.x) {
            const long long r = r0 + k;
            const T rg = g[r], zg = g[r + H], ng = g[r + 2 * H];
            const T dht = err[k];
            const T dn = ((T)1 - zg) * dht * ((T)1 - ng * ng);
            const T dr = dn * u[r + 2 * H] * (rg * ((T)1 - rg));
            const T dz = (hs[o + k] - ng) * dht * (zg * ((T)1 - zg));
            da[r] = dr; da[r + H] = dz; da[r + 2 * H] = dn;
            du[r] = dr; du[r + H] = dz; du[r + 2 * H] = dn * rg;
            e[k] = dr; e[k + H] = dz; e[k + 2 * H] = dn * rg;
            carry[k] = dht * zg;
        }
        __syncthreads();
    }
}
""", "dlrun_gru_sequence_grad")


@layers.register("GRU")
class GRU(Recurrent):
    """r, z = σ(a_r + u_r), σ(a_z + u_z); n = tanh(a_n + r ⊙ u_n); h_t = (1 − z) ⊙ n + z ⊙ h_{t−1}.

    Cho et al. (2014), as PyTorch's nn.GRU and Keras' GRU with reset_after (its default): a_t =
    x_t Wᵀ + b and u_t = h_{t−1}Uᵀ + b_u, with W (3·units × features), U (3·units × units) and the
    biases b and b_u (3·units each) in PyTorch's order, reset, update, new; h_0 = 0. The reset
    gate scales the recurrent term u_n, bias included, which is why there are two biases (for r
    and z they only add). Backward through time: with dh the error of h_t, dn = dh ⊙ (1 − z),
    dz = dh ⊙ (h_{t−1} − n), da_n = dn ⊙ (1 − n²), du_n = da_n ⊙ r, dr = da_n ⊙ u_n, r's and z's
    through σ' = σ(1 − σ) (their da = du), and dh_{t−1} = dh ⊙ z + du_t U.

    Args:
        units: size of the hidden state h (and of each output vector).
        return_sequences: output h_t for every step, (N, T, units), instead of h_T alone, (N, units).
        use_bias: add the biases b and b_u.
        weight_initializer: initializer for W (Keras' glorot_uniform).
        recurrent_initializer: initializer for U (orthogonal, as Keras).
        bias_initializer: initializer for b and b_u.
        weight_regularizer: penalty on W (overrides the run-wide regularizer).
        recurrent_regularizer: penalty on U (overrides the run-wide regularizer).
        bias_regularizer: penalty on b and b_u (biases are otherwise not regularized).

    Shape:
        input (N, T, features) -> output (N, units), or (N, T, units) with return_sequences.

    Example:
        ``- {type: GRU, units: 32}``
    """

    gates = 3
    recurrent_bias = True

    def steps(self, a, hs):
        xp, u, h = self.xp, self.recurrent.data, self.units
        self._us = us = xp.empty_like(a)  # the recurrent terms u_t, kept for backward (u_n and the reset)
        self._gates = a
        run = _SEQUENCE.on(xp, a.dtype) if h <= SEQUENCE_UNITS else None
        if run is not None:  # GPU, small h: one launch for the whole sequence
            ub = self.u_bias.data if self.u_bias is not None else xp.zeros(u.shape[0], dtype=a.dtype)
            n = a.shape[1]
            run(n, 3 * h, a, us, xp.ascontiguousarray(u.T), xp.ascontiguousarray(ub), hs, len(a), n, h)
            return
        step = _STEP.on(xp)
        if step is not None:  # GPU: two launches a step, the product and the cell
            ut = u.T
            ub = self.u_bias.data if self.u_bias is not None else xp.zeros(u.shape[0], dtype=a.dtype)
            for t in range(len(a)):
                step(ub, hs[t], h, a[t], self.backend.matmul(hs[t], ut, out=us[t]), hs[t + 1])
            return
        for t in range(len(a)):
            self.backend.matmul(hs[t], u.T, out=us[t])
            if self.u_bias is not None:
                us[t] += self.u_bias.data
            z = a[t]  # becomes the gates r, z, n in place
            z[:, :2 * h] += us[t, :, :2 * h]
            xp.tanh(xp.multiply(z[:, :2 * h], 0.5, out=z[:, :2 * h]), out=z[:, :2 * h])  # σ = (1 + tanh(a/2))/2
            z[:, :2 * h] += 1
            z[:, :2 * h] *= 0.5
            r, n = z[:, :h], z[:, 2 * h:]
            n += r * us[t, :, 2 * h:]
            xp.tanh(n, out=n)
            # h_t = n + z ⊙ (h_{t-1} − n)
            xp.subtract(hs[t], n, out=hs[t + 1])
            hs[t + 1] *= z[:, h:2 * h]
            hs[t + 1] += n

    def steps_backward(self, dh):
        xp, uw, h = self.xp, self.recurrent.data, self.units
        gates, us, hs = self._gates, self._us, self._hs
        da = xp.empty_like(gates)
        du = xp.empty_like(gates)
        run = _SEQUENCE_GRAD.on(xp, dh.dtype) if h <= SEQUENCE_UNITS else None
        if run is not None:  # GPU, small h: one launch, as forward
            n = dh.shape[1]
            run(n, h, xp.ascontiguousarray(dh), xp.ascontiguousarray(uw), hs, gates, us, da, du, len(dh), n, h)
            return da, du
        step = _STEP_GRAD.on(xp)
        if step is not None:  # GPU: the product and the cell, as forward
            hd, carry = xp.zeros_like(dh[0]), xp.zeros_like(dh[0])  # nothing comes back from past the last step
            for t in range(len(dh) - 1, -1, -1):
                if t < len(dh) - 1:
                    self.backend.matmul(du[t + 1], uw, out=hd)
                step(dh[t], hd, hs[t], gates[t], us[t], h, carry, da[t], du[t])
            return da, du
        for t in range(len(dh) - 1, -1, -1):
            g, d, e = gates[t], da[t], du[t]
            r, z, n = g[:, :h], g[:, h:2 * h], g[:, 2 * h:]
            if t < len(dh) - 1:  # what h_t passed on to step t + 1: directly, and through u_{t+1}
                dh[t] += dh[t + 1] * gates[t + 1][:, h:2 * h]
                dh[t] += self.backend.matmul(du[t + 1], uw)
            dn = d[:, 2 * h:]
            xp.subtract(1, z, out=dn)
            dn *= dh[t]
            dn *= 1 - n * n  # da_n
            xp.multiply(dn, r, out=e[:, 2 * h:])  # du_n = da_n ⊙ r
            xp.multiply(dn, us[t, :, 2 * h:], out=d[:, :h])  # dr
            d[:, :h] *= r * (1 - r)
            xp.subtract(hs[t], n, out=d[:, h:2 * h])  # dz
            d[:, h:2 * h] *= dh[t]
            d[:, h:2 * h] *= z * (1 - z)
            e[:, :2 * h] = d[:, :2 * h]  # r and z see a_t + u_t
        return da, du
