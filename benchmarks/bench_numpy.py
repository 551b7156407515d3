"""A hand-written numpy loop for the spiral workload: the floor a framework on numpy can reach.

No framework: one function, every array preallocated, the tricks of docs/performance.md applied
by hand (column-wise softmax reductions, GEMV bias gradients, a 0/1 float ReLU mask, one flat
parameter buffer for SGD with momentum), no accuracy, no NaN guard, no history. It starts from
the dlrun model's initial weights and sees the same data, so its final loss matches dlrun's.
Comparing it with dlrun on the same machine shows what dlrun's own machinery costs per step;
comparing it with torch shows what numpy can reach there at all.
"""
from __future__ import annotations

import time

import numpy as np

import bench_dlrun
from workloads import Workload


class Unsupported(Exception):
    """Only the spiral MLP (Linear, ReLU, Linear, full batch, SGD with momentum) is written by hand."""


def prepare(w: Workload, device: str = "cpu"):
    if not w.name.startswith("spiral") or device != "cpu":
        raise Unsupported("a hand-written loop exists only for the CPU spiral workload")
    trainer, x, y, epochs, _ = bench_dlrun.build(w, device)
    init = [p.data.copy() for _, p in trainer.model.named_parameters()]  # W1 (100, 2), b1, W2 (3, 100), b2
    sizes = [a.size for a in init]
    n, hidden, classes = len(x), init[0].shape[0], init[2].shape[0]
    x = np.ascontiguousarray(x, dtype=np.float32)
    lr, mom = np.float32(w.learning_rate), np.float32(w.momentum)

    def run():
        flat, grad, vel = (np.zeros(sum(sizes), np.float32) for _ in range(3))
        views = []
        for buf in (flat, grad):
            parts, off = [], 0
            for a in init:
                parts.append(buf[off:off + a.size].reshape(a.shape))
                off += a.size
            views.append(parts)
        (w1, b1, w2, b2), (gw1, gb1, gw2, gb2) = views
        for dst, src in zip(views[0], init):
            dst[...] = src
        h, mask, a = (np.empty((n, hidden), np.float32) for _ in range(3))
        dh = np.empty_like(h)
        s, d = np.empty((n, classes), np.float32), np.empty((n, classes), np.float32)
        m, ssum, r, zy = (np.empty(n, np.float32) for _ in range(4))
        ones = np.ones(n, np.float32)
        flat_y = np.arange(0, n * classes, classes) + y
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(epochs):
            np.matmul(x, w1.T, out=h)
            h += b1
            np.greater(h, 0, out=mask)
            np.multiply(h, mask, out=a)
            np.matmul(a, w2.T, out=s)
            s += b2
            np.maximum(s[:, 0], s[:, 1], out=m)
            for j in range(2, classes):
                np.maximum(m, s[:, j], out=m)
            s.reshape(-1).take(flat_y, out=zy)
            np.subtract(s, m[:, None], out=s)
            np.exp(s, out=s)
            np.add(s[:, 0], s[:, 1], out=ssum)
            for j in range(2, classes):
                ssum += s[:, j]
            np.divide(1.0 / n, ssum, out=r)
            np.log(ssum, out=ssum)
            ssum += m
            ssum -= zy
            loss = ssum.sum() * (1.0 / n)
            np.multiply(s, r[:, None], out=d)
            d.reshape(-1)[flat_y] -= 1.0 / n
            np.matmul(d.T, a, out=gw2)
            np.matmul(ones, d, out=gb2)
            np.matmul(d, w2, out=dh)
            dh *= mask
            np.matmul(dh.T, x, out=gw1)
            np.matmul(ones, dh, out=gb1)
            vel *= mom
            vel += grad
            np.multiply(vel, lr, out=grad)
            flat -= grad
        return time.perf_counter() - t0, time.process_time() - c0, float(loss)

    return run
