"""numpy stand-ins for dlrun's CUDA kernels, so the GPU code paths run on the CPU.

With :func:`emulate` active, ``Kernel.on(numpy)`` returns an emulator instead of None, so every
layer, loss and optimizer takes its GPU branch with numpy arrays. Each emulator follows its
kernel's CUDA source (``backend.KERNELS``) statement by statement, vectorised over the element
index ``i``. Around it, :class:`Emulated` checks what CuPy's ElementwiseKernel checks: the
argument count, one dtype per type letter (T, Y, X) and the exact dtype of fixed-type arrays
(TypeError), non-raw outputs shaped like the broadcast of the non-raw arguments (ValueError),
and it allocates missing outputs. What this cannot see is CuPy itself (its launch and memory);
tests/test_kernels_compile.py compiles the CUDA source, and tests/test_gpu.py runs it.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

from dlrun.backend import BlockKernel, Kernel, Launch
from device_emulation import record_call, will_write
from dlrun.backend.special import INV_SQRT_2PI
from dlrun.layers import gru, lstm, simple_rnn

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _params(spec: str):
    """'raw T x, int32 H' -> [(True, 'T', 'x'), (False, 'int32', 'H')]."""
    out = []
    for part in spec.split(","):
        words = part.split()
        raw = words[0] == "raw"
        out.append((raw, *words[raw:]))
    return out


class Emulated:
    """A kernel's numpy emulator behind CuPy's calling conventions."""

    def __init__(self, kernel: Kernel, body, calls: Counter):
        self.kernel, self.body, self.calls = kernel, body, calls
        self.ins, self.outs = _params(kernel.in_params), _params(kernel.out_params)

    def __call__(self, *args):
        # while tests/device_emulation.py captures a graph: one launch, replayed with these arguments
        will_write(*args)  # (raw inputs may be written too: atomicAdd)
        outs = self._launch(*args)
        record_call(self._launch, (*args[:len(self.ins)], *(outs if isinstance(outs, tuple) else (outs,))), {}, outs)
        return outs

    def _launch(self, *args):
        name, n_in = self.kernel.name, len(self.ins)
        if len(args) not in (n_in, n_in + len(self.outs)):
            raise TypeError(f"{name}: {len(args)} arguments, expected {n_in} or {n_in + len(self.outs)}")
        params = self.ins + self.outs
        types: dict = {}
        for (raw, t, p), a in sorted(zip(params, args), key=lambda pa: pa[0] not in self.outs):  # outputs first
            if not isinstance(a, np.ndarray):
                if raw:
                    raise TypeError(f"{name}: {p} is raw: it takes an array, not {type(a).__name__}")
                continue
            if len(t) > 1 and a.dtype != np.dtype(t):
                raise TypeError(f"{name}: {p} is {a.dtype}, the kernel declares {t}")
            if len(t) == 1 and types.setdefault(t, a.dtype) != a.dtype:
                raise TypeError(f"{name}: {p} is {a.dtype}, but type {t} is {types[t]}")
        shape = np.broadcast_shapes(*[a.shape for (raw, _, _), a in zip(params, args)
                                      if not raw and isinstance(a, np.ndarray)])
        outs = list(args[n_in:])
        for k, (raw, t, p) in enumerate(self.outs):
            if k == len(outs):
                if raw:
                    raise ValueError(f"{name}: raw output {p} must be passed")
                outs.append(np.empty(shape, types[t] if len(t) == 1 else t))
            elif not raw and outs[k].shape != shape:
                raise ValueError(f"{name}: output {p} has shape {outs[k].shape}, the kernel's is {shape}")
        # the arrays' own class (tests/device_emulation.py's device arrays) for what it returns;
        # plain ndarray views of them for the body, which is the kernel, not host code
        kind = next((type(a) for a in args if isinstance(a, np.ndarray)), np.ndarray)
        outs = [o.view(kind) for o in outs]
        v = SimpleNamespace(i=np.arange(math.prod(shape)).reshape(shape))
        for (raw, t, p), a in zip(self.ins, args[:n_in]):
            dt = np.dtype(types.get(t, t) if len(t) == 1 else t)
            if not isinstance(a, np.ndarray):
                a = dt.type(a)  # a host scalar, cast to its parameter's type
            elif not raw:
                a = np.broadcast_to(a.view(np.ndarray), shape)
            else:
                a = a.view(np.ndarray)
            setattr(v, p, a)
        for (_, _, p), a in zip(self.outs, outs):
            setattr(v, p, a.view(np.ndarray))
        self.calls[name] += 1
        self.body(v)
        return outs[0] if len(outs) == 1 else tuple(outs)


class EmulatedBlock:
    """A block kernel's numpy emulator behind CuPy's RawKernel call, ``kernel((blocks,), (threads,), args)``.

    It checks what a raw pointer cannot: each ``T*`` argument is an array of the launch's float
    type and C-contiguous (the kernel reads it flat in C order), a ``const`` one is not written
    (the body gets it read-only), each ``int`` a numpy int32; one block dimension, at most
    ``max_threads_per_block`` threads. The body gets (blocks, threads, *arguments), pointers as
    flat views; its shared arrays have the kernel's static sizes, so an index past them raises.
    """

    def __init__(self, kernel: BlockKernel, body, calls: Counter, dtype, max_threads_per_block: int = 1024):
        self.kernel, self.body, self.calls, self.dtype = kernel, body, calls, np.dtype(dtype)
        self.max_threads_per_block = max_threads_per_block
        signature = re.search(r"__global__\s+void\s+(\w+)\s*\(([^)]*)\)", kernel.source)
        assert signature and signature.group(1) == kernel.name, kernel.name
        self.params = [" ".join(p.split()) for p in signature.group(2).split(",")]

    def __call__(self, grid, block, args):
        # while tests/device_emulation.py captures a graph: one launch, replayed with these arguments
        will_write(*[a for p, a in zip(self.params, args) if "*" in p and not p.startswith("const")])
        self._launch(grid, block, args)
        record_call(self._launch, (grid, block, args), {}, None)

    def _launch(self, grid, block, args):
        name = self.kernel.name
        if len(args) != len(self.params):
            raise TypeError(f"{name}: {len(args)} arguments, the kernel declares {len(self.params)}")
        if len(grid) != 1 or len(block) != 1 or grid[0] < 1 or not 0 < block[0] <= self.max_threads_per_block:
            raise ValueError(f"{name}: launch of {grid} blocks of {block} threads")
        values = []
        for p, a in zip(self.params, args):
            if "*" in p:
                if not isinstance(a, np.ndarray) or a.dtype != self.dtype:
                    raise TypeError(f"{name}: {p} is {getattr(a, 'dtype', type(a))}, the launch's T is {self.dtype}")
                if not a.flags.c_contiguous:
                    raise ValueError(f"{name}: {p} is not C-contiguous")
                flat = a.view(np.ndarray).reshape(-1)
                if p.startswith("const"):
                    flat = flat.view()
                    flat.flags.writeable = False
                values.append(flat)
            elif p.split()[-2:-1] == ["int"]:
                if not isinstance(a, np.int32):
                    raise TypeError(f"{name}: {p} is {type(a).__name__}, not a numpy int32")
                values.append(int(a))
            else:
                raise AssertionError(f"{name}: the emulator does not know the parameter {p!r}")
        self.calls[name] += 1
        self.body(int(grid[0]), int(block[0]), *values)


def _strided(blocks, threads, count):
    """``for (int k = threadIdx.x; k < count; k += blockDim.x)`` in every block at once: for each
    round of the loop, the (block, k) pairs of the threads that run it."""
    tid = np.arange(threads)
    for start in range(0, count, threads):
        b, k = np.meshgrid(np.arange(blocks), start + tid[start + tid < count], indexing="ij")
        yield b.ravel(), k.ravel()


def _flat(a):
    """A raw array indexed by a flat C-order index, as CuPy's CArray does; a view when it can be."""
    return a.reshape(-1)


# --- the emulators, one per kernel, in the order of their CUDA source -------------------------

def _relu(v):
    v.y[...] = v.x * (v.x > 0).astype(v.x.dtype)


def _relu_grad(v):
    v.dx[...] = v.dy * (v.y > 0).astype(v.dy.dtype)


def _gelu(v):
    v.p[...] = 0.5 * _erfc(-v.x * v.x.dtype.type(0.7071067811865476))
    v.y[...] = v.x * v.p


def _gelu_grad(v):
    v.dx[...] = v.dy * (v.p + v.x * v.x.dtype.type(INV_SQRT_2PI) * np.exp(v.x.dtype.type(-0.5) * v.x * v.x))


def _dropout(v):
    v.mask[...] = np.where(v.u >= v.rate, v.scale, v.x.dtype.type(0))
    v.y[...] = v.x * v.mask


def _l2_grad(v):
    v.grad += v.c * v.w


def _l1_grad(v):
    v.grad += np.where(v.w > 0, v.c, np.where(v.w < 0, -v.c, v.w * v.w.dtype.type(0)))


def _in_range(v):
    x = v.x.astype(np.float64)
    ok = (x > -1.0) & (x < float(v.D))
    return ok, np.where(ok, v.x, 0).astype(np.int64)  # (long long)x truncates, like astype


def _gather(v):
    ok, rows = _in_range(v)
    v.y[...] = np.where(ok, _flat(v.W)[rows * v.C + v.c], v.nan)


def _scatter(v):
    ok, rows = _in_range(v)
    g = _flat(v.G)
    assert np.shares_memory(g, v.G), "atomicAdd needs G itself"
    np.add.at(g, (rows * v.C + v.c)[ok], v.dy[ok])


def _sce_exp(v):
    v.p[...] = np.exp(v.z - v.m)


def _sce_nll(v):
    v.out[...] = np.log(v.s) + v.m - _flat(v.z)[v.i * int(v.c) + v.y.astype(np.int64)]


def _sce_grad(v):
    t = np.where((v.i % int(v.c)).astype(v.y.dtype) == v.y, v.on, v.off).astype(v.p.dtype)
    v.d[...] = (v.p / v.s - t) * v.scale


def _maxpool(v):
    H, W, Ho, Wo, kh, kw = (int(getattr(v, k)) for k in ("H", "W", "Ho", "Wo", "kh", "kw"))
    b, a, nc = v.i % Wo, (v.i // Wo) % Ho, v.i // (Wo * Ho)
    r0 = nc * H * W + a * kh * W + b * kw
    x = _flat(v.x)
    best, win, nan = x[r0].copy(), np.zeros(v.i.shape, np.int32), np.zeros(v.i.shape, bool)
    for p in range(kh):
        for q in range(kw):
            val = x[r0 + p * W + q]
            isnan = val != val
            better = ~isnan & ~nan & (val > best)
            best = np.where(isnan | better, val, best)
            win = np.where(isnan | better, p * kw + q, win)
            nan |= isnan
    v.y[...] = best
    v.arg[...] = win


def _maxpool_grad(v):
    H, W, Ho, Wo, kh, kw = (int(getattr(v, k)) for k in ("H", "W", "Ho", "Wo", "kh", "kw"))
    c, r, nc = v.i % W, (v.i // W) % H, v.i // (W * H)
    a, b = r // kh, c // kw
    inside = (a < Ho) & (b < Wo)
    o = np.where(inside, (nc * Ho + a) * Wo + b, 0)
    hit = inside & (_flat(v.arg)[o] == (r - a * kh) * kw + (c - b * kw))
    v.dx[...] = np.where(hit, _flat(v.dy)[o], 0)


def _maxpool_nan(v):
    hit = v.pending & (v.g != v.g)
    v.m[...] = np.where(hit, True, v.m)
    v.pending[...] = np.where(hit, False, v.pending)


def _sgd(v):
    lr = v.h[0]
    v.w -= lr * (v.g + v.wd * v.w)


def _sgd_momentum(v):
    lr = v.h[0]
    d = v.g + v.wd * v.w
    v.v[...] = v.mom * v.v + d
    v.w -= lr * (d + v.mom * v.v if v.nesterov else v.v)


def _adam(v):
    lr_t, eps_t, keep = v.h[0], v.h[1], v.h[2]
    d = v.g + v.wd * v.w
    v.w *= keep
    v.m[...] = v.b1 * v.m + (1 - v.b1) * d
    v.v[...] = v.b2 * v.v + (1 - v.b2) * d * d
    v.w -= lr_t * v.m / (np.sqrt(v.v) + eps_t)


def _rmsprop(v):
    lr = v.h[0]
    d = v.g + v.wd * v.w
    v.v[...] = v.rho * v.v + (1 - v.rho) * d * d
    v.w -= lr * d / (np.sqrt(v.v) + v.eps)


def _rmsprop_momentum(v):
    lr = v.h[0]
    d = v.g + v.wd * v.w
    v.v[...] = v.rho * v.v + (1 - v.rho) * d * d
    v.b[...] = v.mom * v.b + d / (np.sqrt(v.v) + v.eps)
    v.w -= lr * v.b


def _adagrad(v):
    lr = v.h[0]
    d = v.g + v.wd * v.w
    v.s += d * d
    v.w -= lr * d / (np.sqrt(v.s) + v.eps)


def _cell(v, gates, *raw):
    """A recurrent cell's thread indices: units H, each thread's first gate r in its row, and
    the raw arrays flat (the outputs among them views, so that writes land)."""
    H = int(v.H)
    flat = [_flat(a) for a in raw]
    assert all(np.shares_memory(f, a) for f, a in zip(flat, raw)), "a raw array must be written in place"
    return H, (v.i // H) * gates * H + v.i % H, flat


def _lstm_step(v):
    H, r, (z, u) = _cell(v, 4, v.z, v.u)
    half = v.z.dtype.type(0.5)
    ig = np.tanh((z[r] + u[r]) * half) * half + half
    fg = np.tanh((z[r + H] + u[r + H]) * half) * half + half
    gg = np.tanh(z[r + 2 * H] + u[r + 2 * H])
    og = np.tanh((z[r + 3 * H] + u[r + 3 * H]) * half) * half + half
    z[r], z[r + H], z[r + 2 * H], z[r + 3 * H] = ig, fg, gg, og
    v.c[...] = fg * v.c_prev + ig * gg
    v.tc[...] = np.tanh(v.c)
    v.h[...] = og * v.tc


def _lstm_step_grad(v):
    H, r, (z, d) = _cell(v, 4, v.z, v.d)
    ig, fg, gg, og = z[r], z[r + H], z[r + 2 * H], z[r + 3 * H]
    e = v.dh + v.hd
    d[r + 3 * H] = e * v.tc * ((1 - og) * og)
    dct = v.dc + e * og * (1 - v.tc * v.tc)
    d[r] = dct * gg * ((1 - ig) * ig)
    d[r + H] = dct * v.c_prev * ((1 - fg) * fg)
    d[r + 2 * H] = dct * ig * ((1 - gg) * (gg + 1))
    v.dc[...] = dct * fg


def _gru_step(v):
    H, r, (z, u, ub) = _cell(v, 3, v.z, v.u, v.ub)
    j = v.i % H
    ur, uz, un = u[r] + ub[j], u[r + H] + ub[j + H], u[r + 2 * H] + ub[j + 2 * H]
    u[r], u[r + H], u[r + 2 * H] = ur, uz, un
    half = v.z.dtype.type(0.5)
    rg = (np.tanh((z[r] + ur) * half) + 1) * half
    zg = (np.tanh((z[r + H] + uz) * half) + 1) * half
    ng = np.tanh(z[r + 2 * H] + rg * un)
    z[r], z[r + H], z[r + 2 * H] = rg, zg, ng
    v.h[...] = (v.h_prev - ng) * zg + ng


def _gru_step_grad(v):
    H, r, (g, u, d, e) = _cell(v, 3, v.g, v.u, v.d, v.e)
    rg, zg, ng = g[r], g[r + H], g[r + 2 * H]
    dht = v.dh + v.carry + v.hd
    dn = (1 - zg) * dht * (1 - ng * ng)
    dr = dn * u[r + 2 * H] * (rg * (1 - rg))
    dz = (v.h_prev - ng) * dht * (zg * (1 - zg))
    d[r], d[r + H], d[r + 2 * H] = dr, dz, dn
    e[r], e[r + H], e[r + 2 * H] = dr, dz, dn * rg
    v.carry[...] = dht * zg


def _rnn_step(v):
    v.h[...] = np.tanh(v.a + v.u)


def _rnn_step_grad(v):
    v.d[...] = (1 - v.h * v.h) * (v.dh + v.hd)


def _lstm_sequence(blocks, threads, z, ut, hs, cs, tc, steps, n, H):
    G, half = 4 * H, z.dtype.type(0.5)
    h = np.full((blocks, lstm.SEQUENCE_UNITS), np.nan, z.dtype)  # shared, unset
    g = np.full((blocks, 4 * lstm.SEQUENCE_UNITS), np.nan, z.dtype)
    for b, k in _strided(blocks, threads, H):
        h[b, k] = hs[b * H + k]
    for t in range(steps):
        for b, j in _strided(blocks, threads, G):
            zt = (t * n + b) * G
            acc = np.zeros(len(b), z.dtype)
            for k in range(H):
                acc += ut[k * G + j] * h[b, k]
            g[b, j] = z[zt + j] + acc
        # __syncthreads()
        for b, k in _strided(blocks, threads, H):
            zt, o = (t * n + b) * G, (t * n + b) * H
            nxt = o + n * H
            ig = np.tanh(g[b, k] * half) * half + half
            fg = np.tanh(g[b, k + H] * half) * half + half
            gg = np.tanh(g[b, k + 2 * H])
            og = np.tanh(g[b, k + 3 * H] * half) * half + half
            z[zt + k], z[zt + k + H], z[zt + k + 2 * H], z[zt + k + 3 * H] = ig, fg, gg, og
            c = fg * cs[o + k] + ig * gg
            tcv = np.tanh(c)
            hv = og * tcv
            cs[nxt + k], tc[o + k], hs[nxt + k] = c, tcv, hv
            h[b, k] = hv
        # __syncthreads()


def _lstm_sequence_grad(blocks, threads, dh, u, z, cs, tc, da, steps, n, H):
    G = 4 * H
    d = np.full((blocks, 4 * lstm.SEQUENCE_UNITS), np.nan, dh.dtype)  # shared, unset
    e = np.full((blocks, lstm.SEQUENCE_UNITS), np.nan, dh.dtype)
    dc = np.full((blocks, lstm.SEQUENCE_UNITS), np.nan, dh.dtype)
    for b, k in _strided(blocks, threads, H):
        dc[b, k] = 0
    for t in range(steps - 1, -1, -1):
        for b, k in _strided(blocks, threads, H):
            o = (t * n + b) * H
            hd = np.zeros(len(b), dh.dtype)
            if t < steps - 1:
                for j in range(G):
                    hd += d[b, j] * u[j * H + k]
            e[b, k] = dh[o + k] + hd
        # __syncthreads()
        for b, k in _strided(blocks, threads, H):
            o, r = (t * n + b) * H, (t * n + b) * G + k
            ig, fg, gg, og = z[r], z[r + H], z[r + 2 * H], z[r + 3 * H]
            tcv, ek = tc[o + k], e[b, k]
            dct = dc[b, k] + ek * og * (1 - tcv * tcv)
            di = dct * gg * ((1 - ig) * ig)
            df = dct * cs[o + k] * ((1 - fg) * fg)
            dg = dct * ig * ((1 - gg) * (gg + 1))
            dout = ek * tcv * ((1 - og) * og)
            dc[b, k] = dct * fg
            d[b, k], d[b, k + H], d[b, k + 2 * H], d[b, k + 3 * H] = di, df, dg, dout
            da[r], da[r + H], da[r + 2 * H], da[r + 3 * H] = di, df, dg, dout
        # __syncthreads()


def _gru_sequence(blocks, threads, z, u, ut, ub, hs, steps, n, H):
    G, half = 3 * H, z.dtype.type(0.5)
    h = np.full((blocks, gru.SEQUENCE_UNITS), np.nan, z.dtype)  # shared, unset
    g = np.full((blocks, 3 * gru.SEQUENCE_UNITS), np.nan, z.dtype)
    for b, k in _strided(blocks, threads, H):
        h[b, k] = hs[b * H + k]
    for t in range(steps):
        for b, j in _strided(blocks, threads, G):
            r0 = (t * n + b) * G
            acc = np.zeros(len(b), z.dtype)
            for k in range(H):
                acc += ut[k * G + j] * h[b, k]
            uj = acc + ub[j]
            u[r0 + j] = uj
            g[b, j] = uj
        # __syncthreads()
        for b, k in _strided(blocks, threads, H):
            r, nxt = (t * n + b) * G + k, ((t + 1) * n + b) * H
            ur, uz, un = g[b, k], g[b, k + H], g[b, k + 2 * H]
            rg = (np.tanh((z[r] + ur) * half) + 1) * half
            zg = (np.tanh((z[r + H] + uz) * half) + 1) * half
            ng = np.tanh(z[r + 2 * H] + rg * un)
            z[r], z[r + H], z[r + 2 * H] = rg, zg, ng
            hv = (h[b, k] - ng) * zg + ng
            hs[nxt + k] = hv
            h[b, k] = hv
        # __syncthreads()


def _gru_sequence_grad(blocks, threads, dh, uw, hs, g, u, da, du, steps, n, H):
    G = 3 * H
    e = np.full((blocks, 3 * gru.SEQUENCE_UNITS), np.nan, dh.dtype)  # shared, unset
    err = np.full((blocks, gru.SEQUENCE_UNITS), np.nan, dh.dtype)
    carry = np.full((blocks, gru.SEQUENCE_UNITS), np.nan, dh.dtype)
    for b, k in _strided(blocks, threads, H):
        carry[b, k] = 0
    for t in range(steps - 1, -1, -1):
        for b, k in _strided(blocks, threads, H):
            o = (t * n + b) * H
            hd = np.zeros(len(b), dh.dtype)
            if t < steps - 1:
                for j in range(G):
                    hd += e[b, j] * uw[j * H + k]
            err[b, k] = dh[o + k] + carry[b, k] + hd
        # __syncthreads()
        for b, k in _strided(blocks, threads, H):
            o, r = (t * n + b) * H, (t * n + b) * G + k
            rg, zg, ng = g[r], g[r + H], g[r + 2 * H]
            dht = err[b, k]
            dn = (1 - zg) * dht * (1 - ng * ng)
            dr = dn * u[r + 2 * H] * (rg * (1 - rg))
            dz = (hs[o + k] - ng) * dht * (zg * (1 - zg))
            da[r], da[r + H], da[r + 2 * H] = dr, dz, dn
            du[r], du[r + H], du[r + 2 * H] = dr, dz, dn * rg
            e[b, k], e[b, k + H], e[b, k + 2 * H] = dr, dz, dn * rg
            carry[b, k] = dht * zg
        # __syncthreads()


def _rnn_sequence(blocks, threads, a, ut, hs, steps, n, H):
    h = np.full((blocks, simple_rnn.SEQUENCE_UNITS), np.nan, a.dtype)  # shared, unset
    g = np.full((blocks, simple_rnn.SEQUENCE_UNITS), np.nan, a.dtype)
    for b, k in _strided(blocks, threads, H):
        h[b, k] = hs[b * H + k]
    for t in range(steps):
        for b, j in _strided(blocks, threads, H):
            o = (t * n + b) * H
            acc = np.zeros(len(b), a.dtype)
            for k in range(H):
                acc += ut[k * H + j] * h[b, k]
            g[b, j] = np.tanh(a[o + j] + acc)
        # __syncthreads()
        for b, k in _strided(blocks, threads, H):
            nxt = ((t + 1) * n + b) * H
            hs[nxt + k] = g[b, k]
            h[b, k] = g[b, k]
        # __syncthreads()


def _rnn_sequence_grad(blocks, threads, dh, u, hs, da, steps, n, H):
    d = np.full((blocks, simple_rnn.SEQUENCE_UNITS), np.nan, dh.dtype)  # shared, unset
    e = np.full((blocks, simple_rnn.SEQUENCE_UNITS), np.nan, dh.dtype)
    for t in range(steps - 1, -1, -1):
        for b, k in _strided(blocks, threads, H):
            o = (t * n + b) * H
            hd = np.zeros(len(b), dh.dtype)
            if t < steps - 1:
                for j in range(H):
                    hd += d[b, j] * u[j * H + k]
            hv = hs[o + n * H + k]
            e[b, k] = (1 - hv * hv) * (dh[o + k] + hd)
        # __syncthreads()
        for b, k in _strided(blocks, threads, H):
            o = (t * n + b) * H
            d[b, k] = e[b, k]
            da[o + k] = e[b, k]
        # __syncthreads()


BLOCK_EMULATORS = {"dlrun_lstm_sequence": _lstm_sequence, "dlrun_lstm_sequence_grad": _lstm_sequence_grad,
                   "dlrun_gru_sequence": _gru_sequence, "dlrun_gru_sequence_grad": _gru_sequence_grad,
                   "dlrun_rnn_sequence": _rnn_sequence, "dlrun_rnn_sequence_grad": _rnn_sequence_grad}

EMULATORS = {
    "dlrun_relu": _relu, "dlrun_relu_grad": _relu_grad, "dlrun_gelu": _gelu, "dlrun_gelu_grad": _gelu_grad,
    "dlrun_dropout": _dropout, "dlrun_l2_grad": _l2_grad, "dlrun_l1_grad": _l1_grad,
    "dlrun_embedding": _gather, "dlrun_embedding_grad": _scatter,
    "dlrun_sce_exp": _sce_exp, "dlrun_sce_nll": _sce_nll, "dlrun_sce_grad": _sce_grad,
    "dlrun_maxpool": _maxpool, "dlrun_maxpool_grad": _maxpool_grad,
    "dlrun_maxpool_nan": _maxpool_nan,
    "dlrun_sgd": _sgd, "dlrun_sgd_momentum": _sgd_momentum, "dlrun_adam": _adam,
    "dlrun_lstm_step": _lstm_step, "dlrun_lstm_step_grad": _lstm_step_grad,
    "dlrun_gru_step": _gru_step, "dlrun_gru_step_grad": _gru_step_grad,
    "dlrun_rnn_step": _rnn_step, "dlrun_rnn_step_grad": _rnn_step_grad,
    "dlrun_rmsprop": _rmsprop, "dlrun_rmsprop_momentum": _rmsprop_momentum, "dlrun_adagrad": _adagrad,
}


@contextmanager
def emulate(monkeypatch, max_threads_per_block: int = 1024):
    """Within it, every Kernel and BlockKernel runs its numpy emulator on numpy arrays (and on
    those of tests/device_emulation.py's stand-in for CuPy); yields the call counts. A block
    kernel reports ``max_threads_per_block`` as its compiled limit."""
    calls: Counter = Counter()
    real_on, real_block_on = Kernel.on, BlockKernel.on

    def emulated(xp):
        return xp is np or getattr(xp, "__name__", "") == "cupy_emulated"

    def on(self, xp):
        return Emulated(self, EMULATORS[self.name], calls) if emulated(xp) else real_on(self, xp)

    def block_on(self, xp, dtype):
        if emulated(xp):
            return Launch(EmulatedBlock(self, BLOCK_EMULATORS[self.name], calls, dtype, max_threads_per_block))
        return real_block_on(self, xp, dtype)

    with monkeypatch.context() as m:
        m.setattr(Kernel, "on", on)
        m.setattr(BlockKernel, "on", block_on)
        yield calls


def import_all_modules() -> None:
    """Import every dlrun module, so every kernel is declared in backend.KERNELS and BLOCK_KERNELS."""
    import importlib
    import pkgutil

    import dlrun

    for m in pkgutil.walk_packages(dlrun.__path__, "dlrun."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)


def reference(x, layer, dy):
    """(y, dx) window by window: the maximum, NaN if the window holds one; the gradient to the
    window's last NaN if it holds any, else to its first maximum (row-major order)."""
    (kh, kw), (sh, sw), (ph, pw) = layer.pool_size, layer.stride, layer.padding
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), -np.inf)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    ho, wo = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    y, dxp = np.empty((n, c, ho, wo)), np.zeros(xp.shape)
    for i, j, a, b in np.ndindex(n, c, ho, wo):
        win = xp[i, j, a * sh:a * sh + kh, b * sw:b * sw + kw].reshape(-1)
        nans = np.flatnonzero(np.isnan(win))
        k = nans[-1] if len(nans) else int(np.argmax(win))
        y[i, j, a, b] = win[k]
        r, q = divmod(int(k), kw)
        dxp[i, j, a * sh + r, b * sw + q] += dy[i, j, a, b]
    return y, dxp[:, :, ph:ph + h, pw:pw + w]
