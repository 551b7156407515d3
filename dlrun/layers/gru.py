"""GRU: the gated recurrent unit, as PyTorch's nn.GRU (the reset gate after the recurrent product)."""
from __future__ import annotations

from ..backend import BlockKernel, Kernel
from ..registry import layers
from .recurrent import Recurrent, Workspace

# On the GPU a time step is its recurrent product (cuBLAS) and one of these launches, where the
# ufunc path takes about ten each way. Thread i is unit i % H of sample i / H; the gates of a row
# sit H apart in PyTorch's order, r, z, n. The formulas are the CPU path's.
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


_ORDER = (2, 0, 1)  # the CPU path's order of the input terms, n, r, z, in PyTorch's block numbers


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
        step, ut = _STEP.on(xp), u.T  # two launches a step: the product and the cell
        ub = self.u_bias.data if self.u_bias is not None else xp.zeros(u.shape[0], dtype=a.dtype)
        for t in range(len(a)):
            step(ub, hs[t], h, a[t], self.backend.matmul(hs[t], ut, out=us[t]), hs[t + 1])

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
        step = _STEP_GRAD.on(xp)  # the product and the cell, as forward
        hd, carry = xp.zeros_like(dh[0]), xp.zeros_like(dh[0])  # nothing comes back from past the last step
        for t in range(len(dh) - 1, -1, -1):
            if t < len(dh) - 1:
                self.backend.matmul(du[t + 1], uw, out=hd)
            step(dh[t], hd, hs[t], gates[t], us[t], h, carry, da[t], du[t])
        return da, du

    # On the CPU (numpy) the layer keeps its own layout, features first, as the LSTM's (see
    # dlrun.layers.lstm): a step's terms are (units, N) blocks, so each numpy call makes one pass.
    # The input terms x_t Wᵀ + b of every step come from one batched product on [x_t; 1], in the
    # order n, r, z; each step's recurrent terms U h_{t−1} + b_u from one product on [h_{t−1}; 1],
    # in PyTorch's order r, z, n. The σ gates' rows are halved (exact), so σ(a) = (1 + tanh(a/2))/2.
    # Backward writes each step's errors as rows dn, dr, dz, du_n: the input terms' errors are the
    # first three, the recurrent terms' the last three (du_r = dr, du_z = dz), each one block.

    def forward(self, x, y=None):
        self._fused = self.runs_fused(_SEQUENCE, _STEP, SEQUENCE_UNITS, x.dtype)
        if self._fused:  # CuPy: the fused kernels on Recurrent's layout
            return super().forward(x)
        xp, h = self.xp, self.units
        n, steps, d = x.shape
        w = self._host(n, steps, d, x.dtype)
        w.xa[:, :d] = x.transpose(1, 2, 0)
        wa, ua = w.wa, w.ua
        xp.take(self.weight.data, self.gate_rows(_ORDER), axis=0, out=wa[:, :d])
        ua[:, :h] = self.recurrent.data
        if self.bias is not None:
            xp.take(self.bias.data, self.gate_rows(_ORDER), out=wa[:, d])
            ua[:, h] = self.u_bias.data
        wa[h:] *= 0.5
        ua[:2 * h] *= 0.5
        matmul, tanh, multiply, subtract = self.backend.matmul, xp.tanh, xp.multiply, xp.subtract
        matmul(wa, w.xa, out=w.g)
        m = w.m
        for h_in, u, rz, u_rz, r, u_n, a_n, z, h_prev, h_next in w.steps:
            matmul(ua, h_in, out=u)
            rz += u_rz
            tanh(rz, out=rz)
            rz *= 0.5
            rz += 0.5
            a_n += multiply(r, u_n, out=m)
            tanh(a_n, out=a_n)  # n
            subtract(h_prev, a_n, out=h_next)  # h_t = n + z ⊙ (h_{t−1} − n)
            h_next *= z
            h_next += a_n
        self._work = w
        return self.outputs_of(w.hs[1:, :h])

    def backward(self, dy):
        if self._fused:
            return super().backward(dy)
        xp, h, w = self.xp, self.units, self._work
        b = self._host_backward(w)
        g, e, errors = w.g, b.dh, b.errors
        sequences = self.return_sequences
        self.errors_into(e, dy)
        # what does not depend on the errors carried back, for every step at once:
        # dn = e ⊙ (1 − z)(1 − n²), dr = dn ⊙ u_n ⊙ r(1 − r), dz = e ⊙ (h_{t−1} − n) ⊙ z(1 − z)
        n_, r_, z_ = g[:, :h], g[:, h:2 * h], g[:, 2 * h:]
        pn, pr, pz, tmp = b.pn, b.pr, b.pz, b.tmp
        xp.subtract(1, z_, out=pn)
        xp.multiply(n_, n_, out=tmp)
        pn *= xp.subtract(1, tmp, out=tmp)
        xp.subtract(1, r_, out=pr)
        pr *= r_
        pr *= w.us[:, 2 * h:]
        xp.subtract(1, z_, out=pz)
        pz *= z_
        pz *= xp.subtract(w.hs[:-1, :h], n_, out=tmp)
        matmul, multiply = self.backend.matmul, xp.multiply
        ut, carry, hd = self.recurrent.data.T, b.carry, b.hd
        for e_t, du_next, pn_t, pr_t, pz_t, r, z, dn, dr, dz, du_n in b.steps:
            if du_next is not None:  # what h_t passed on: directly (⊙ z_{t+1}) and through u_{t+1}
                if sequences:
                    e_t += matmul(ut, du_next, out=hd)
                else:
                    matmul(ut, du_next, out=e_t)
                e_t += carry
            multiply(e_t, pn_t, out=dn)
            multiply(dn, pr_t, out=dr)
            multiply(e_t, pz_t, out=dz)
            multiply(dn, r, out=du_n)
            multiply(e_t, z, out=carry)
        # dW, db: Σ_t (dn, dr, dz)_t [x_t; 1]ᵀ; dU, db_u: Σ_t (dr, dz, du_n)_t [h_{t−1}; 1]ᵀ
        d = self.weight.grad.shape[1]
        gw = matmul(errors[:, :3 * h], w.xa.transpose(0, 2, 1), out=b.gw).sum(axis=0)
        inverse = self.gate_rows(_ORDER, inverse=True)
        xp.take(gw[:, :d], inverse, axis=0, out=self.weight.grad)
        gu = matmul(errors[:, h:], w.hs[:-1].transpose(0, 2, 1), out=b.gu).sum(axis=0)
        self.recurrent.grad[...] = gu[:, :h]
        if self.bias is not None:
            xp.take(gw[:, d], inverse, out=self.bias.grad)
            self.u_bias.grad[...] = gu[:, h]
        if not self.needs_input_grad:
            return None
        dx = matmul(xp.take(self.weight.data, self.gate_rows(_ORDER), axis=0).T, errors[:, :3 * h])  # (T, D, N)
        return xp.ascontiguousarray(dx.transpose(2, 0, 1))

    def _host(self, n: int, steps: int, d: int, dtype):
        """The CPU path's forward arrays for N sequences of T steps of D features and each step's
        views (one set per shape, reused across batches while the trainer owns the outputs)."""
        xp, h = self.xp, self.units
        one = int(self.bias is not None)

        def make():
            xa = xp.empty((steps, d + one, n), dtype)  # [x_t; 1]
            xa[:, d:] = 1
            hs = xp.empty((steps + 1, h + one, n), dtype)  # [h_{t−1}; 1], h_T in the last
            hs[:, h:] = 1
            hs[0, :h] = 0
            g, us = xp.empty((steps, 3 * h, n), dtype), xp.empty((steps, 3 * h, n), dtype)
            return Workspace(xa=xa, hs=hs, g=g, us=us, m=xp.empty((h, n), dtype),
                             wa=xp.empty((3 * h, d + one), dtype), ua=xp.empty((3 * h, h + one), dtype),
                             steps=[(hs[t], us[t], g[t, h:], us[t, :2 * h], g[t, h:2 * h], us[t, 2 * h:], g[t, :h],
                                     g[t, 2 * h:], hs[t, :h], hs[t + 1, :h]) for t in range(steps)])
        return self.buffers.group(("gru", n, steps, d, dtype), make)

    def _host_backward(self, w):
        """The CPU path's backward arrays and each step's views, latest step first, as ``_host``."""
        xp, h = self.xp, self.units
        steps, _, n = w.g.shape
        dtype = w.g.dtype

        def make():
            errors = xp.empty((steps, 4 * h, n), dtype)  # dn, dr, dz, du_n
            dh, pn, pr, pz = (xp.empty((steps, h, n), dtype) for _ in range(4))
            g = w.g
            return Workspace(forward=w, errors=errors, dh=dh, pn=pn, pr=pr, pz=pz, tmp=xp.empty((steps, h, n), dtype),
                             carry=xp.empty((h, n), dtype), hd=xp.empty((h, n), dtype),
                             gw=xp.empty((steps, 3 * h, w.xa.shape[1]), dtype),
                             gu=xp.empty((steps, 3 * h, w.hs.shape[1]), dtype),
                             steps=[(dh[t], errors[t + 1, h:] if t < steps - 1 else None, pn[t], pr[t], pz[t],
                                     g[t, h:2 * h], g[t, 2 * h:], errors[t, :h], errors[t, h:2 * h],
                                     errors[t, 2 * h:3 * h], errors[t, 3 * h:]) for t in range(steps - 1, -1, -1)])
        return self.backward_workspace(("gru_backward", n, steps, dtype), w, make)
