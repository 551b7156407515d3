"""What bounds a recurrent workload's training step on the CPU: per batch, PyTorch's fit and dlrun's,
dlrun's recurrent layer forward and backward, and that layer's matrix products replayed alone.

    python benchmarks/recurrent_floor.py [--only lstm] [--threads 1] [--rounds 5] [--repeats 3]

The fits are benchmarks/run.py's (benchmarks/worker.py: same workload, weights, data and
optimizer, each in its own process, CPU time divided by the number of batches). The layer's
figures come from a third process: the workload's model in the trainer's fast mode, its first
layer (the recurrent one, which then computes no input gradient) run forward and backward on
one batch, and the same BLAS calls (every ``backend.matmul`` the layer made, recorded during one
forward and backward and replayed on the same arrays in the same order) timed alone. That replay
is the layer's floor for as long as its products stay as they are: the rest of its time is its
elementwise work and Python. The three processes alternate over ``--rounds``; medians are shown.
The BLAS kernels are the ones numpy's OpenBLAS picks in this environment (``OPENBLAS_CORETYPE``
selects them where it is set); the GFLOP/s of a 1024³ float32 product is shown next to them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from run import spawn  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


def layer_side(name: str, repeats: int) -> dict:
    """Time the workload's recurrent layer (forward and backward, one batch) and its products replayed."""
    import numpy as np

    from bench_dlrun import build

    trainer, x, _, _, _ = build(WORKLOADS[name])
    trainer.fast_mode(True)
    layer, backend = trainer.model.layers[0], trainer.model.layers[0].backend
    n = trainer.batch_size or len(x)
    xb = np.ascontiguousarray(x[:n])
    y = layer.forward(xb)
    dy = np.random.default_rng(0).standard_normal(y.shape).astype(y.dtype)
    layer.backward(dy)
    calls, real = [], backend.matmul

    def record(a, b, out=None):
        calls.append((a, b, out))
        return real(a, b, out=out)

    backend.matmul = record
    try:
        layer.forward(xb)
        layer.backward(dy)
    finally:
        del backend.matmul  # the class's method again

    def step():
        layer.forward(xb)
        layer.backward(dy)

    def replay():
        for a, b, out in calls:
            np.matmul(a, b, out=out)

    def per_call(fn, loops: int = 20) -> float:
        fn()
        samples = []
        for _ in range(repeats):
            c0 = time.process_time()
            for _ in range(loops):
                fn()
            samples.append((time.process_time() - c0) / loops)
        return statistics.median(samples)

    flops = sum(2 * np.matmul(a, b).size * a.shape[-1] for a, b, _ in calls)
    big = np.ones((1024, 1024), np.float32)
    peak = 2 * 1024 ** 3 / per_call(lambda: big @ big, 3) / 1e9
    layer_s, products_s = per_call(step), per_call(replay)
    return {"layer": layer_s, "products": products_s, "calls": len(calls), "gflop": flops / 1e9,
            "products_gflops": flops / products_s / 1e9, "peak_gflops": peak, "batches": -(-len(x) // n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="lstm",
                    help="a workload of benchmarks/workloads.py whose first layer is recurrent")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--side", help=argparse.SUPPRESS)  # the layer's process
    a = ap.parse_args()
    if a.side:
        print(json.dumps(layer_side(a.side, a.repeats)))
        return
    fits: dict = {"torch": [], "dlrun": []}
    layer = []
    for r in range(a.rounds):
        for impl in fits:
            res = spawn(["train", impl, a.only, "--repeats", str(a.repeats)], a.threads)
            if not res.get("available"):
                sys.exit(f"{impl}: {res.get('reason')}")
            fits[impl].append(statistics.median(res["cpu_times"]))
        res = spawn(["--side", a.only, "--repeats", str(a.repeats)], a.threads, worker=Path(__file__))
        if "layer" not in res:
            sys.exit(f"layer: {res.get('reason')}")
        layer.append(res)
        print(f"round {r + 1}/{a.rounds}: torch fit {fits['torch'][-1] * 1e3:.1f} ms, dlrun fit "
              f"{fits['dlrun'][-1] * 1e3:.1f} ms, layer {res['layer'] * 1e3:.3f} ms/batch, its products "
              f"{res['products'] * 1e3:.3f} ms/batch", flush=True)
    batches = layer[0]["batches"]

    def ms(values):
        return f"{statistics.median(values) * 1e3:.3f} ({min(values) * 1e3:.3f}-{max(values) * 1e3:.3f})"

    torch_b, dlrun_b = [t / batches for t in fits["torch"]], [t / batches for t in fits["dlrun"]]
    print(f"\n{WORKLOADS[a.only].title}; {a.threads} thread(s), CPU time per batch, ms: median (min-max) of "
          f"{a.rounds} rounds")
    print(f"PyTorch fit:                     {ms(torch_b)}")
    ratio = statistics.median(dlrun_b) / statistics.median(torch_b)
    print(f"dlrun fit:                       {ms(dlrun_b)}   ({ratio:.2f}x)")
    print(f"dlrun recurrent layer, fwd+bwd:  {ms([r['layer'] for r in layer])}")
    rate = statistics.median(r["products_gflops"] for r in layer)
    peak = statistics.median(r["peak_gflops"] for r in layer)
    print(f"  its {layer[0]['calls']} products alone:     {ms([r['products'] for r in layer])}   "
          f"({layer[0]['gflop'] * 1e3:.0f} MFLOP at {rate:.0f} GFLOP/s; a 1024^3 product: {peak:.0f} GFLOP/s)")
    share = [r["products"] / t for r, t in zip(layer, torch_b)]
    print(f"  products / PyTorch's whole step: {statistics.median(share):.2f}")


if __name__ == "__main__":
    main()
