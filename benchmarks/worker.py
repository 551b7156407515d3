"""One benchmark configuration in its own process; prints one JSON line.

    python benchmarks/worker.py train dlrun|torch|jax|numpy WORKLOAD --repeats 5 [--device gpu]
    python benchmarks/worker.py gemm numpy|torch [--device gpu]
    python benchmarks/worker.py gradcheck --repeats 2

run.py sets OMP/OPENBLAS/MKL_NUM_THREADS in the environment before this process starts.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]


def rss_mib(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


def gpu_memory_mib(lib: str) -> float:
    """Peak device memory: torch's max allocated; CuPy's pool size (the pool keeps what it took),
    with the pools of dlrun's CUDA graphs of the training step."""
    if lib == "torch":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    import cupy
    from dlrun.training import capture

    return (cupy.get_default_memory_pool().total_bytes() + capture.pool_bytes()) / 2**20


def gemm_gpu(lib: str, n: int = 8192, samples: int = 5) -> dict:
    """float32 (no TF32) n^3 matmul rate on the GPU, timed with CUDA events."""
    if lib == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
        c = torch.empty(n, n, device="cuda")
        mm = lambda: torch.matmul(a, b, out=c)  # noqa: E731
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        elapsed = lambda e0, e1: e0.elapsed_time(e1)  # noqa: E731
    else:
        import cupy

        rng = cupy.random.default_rng(0)
        a, b = rng.standard_normal((n, n), dtype=cupy.float32), rng.standard_normal((n, n), dtype=cupy.float32)
        c = cupy.empty((n, n), dtype=cupy.float32)
        mm = lambda: cupy.matmul(a, b, out=c)  # noqa: E731
        ev = cupy.cuda.Event
        elapsed = cupy.cuda.get_elapsed_time
    mm()
    rates = []
    for _ in range(samples):
        e0, e1 = ev(), ev()
        e0.record()
        for _ in range(10):
            mm()
        e1.record()
        e1.synchronize()
        rates.append(2.0 * n ** 3 * 10 / (elapsed(e0, e1) / 1e3) / 1e9)
    return {"gflops": rates, "gflops_cpu": rates}


def gemm(lib: str, threads: int, n: int = 2048, samples: int = 5) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    if lib == "torch":
        import torch

        torch.set_num_threads(threads)
        a, b = torch.from_numpy(a), torch.from_numpy(b)
        c = torch.empty((n, n))
        mm = lambda: torch.matmul(a, b, out=c)  # noqa: E731
    else:
        c = np.empty((n, n), dtype=np.float32)
        mm = lambda: np.matmul(a, b, out=c)  # noqa: E731
    mm()
    rates, cpu_rates = [], []
    for _ in range(samples):
        k, t0, c0 = 0, time.perf_counter(), time.process_time()
        while True:  # each sample: at least 0.2 s of back-to-back calls
            mm()
            k += 1
            dt = time.perf_counter() - t0
            if dt >= 0.2:
                break
        rates.append(2.0 * n ** 3 * k / dt / 1e9)
        cpu_rates.append(2.0 * n ** 3 * k / (time.process_time() - c0) / 1e9)
    return {"gflops": rates, "gflops_cpu": cpu_rates}


def train(impl: str, name: str, threads: int, repeats: int, device: str = "cpu") -> dict:
    from workloads import WORKLOADS, missing_layers

    w = WORKLOADS[name]
    missing = missing_layers(w)
    if w.config and not Path(w.config).is_file():
        missing.append(Path(w.config).name)
    if missing:
        return {"available": False, "reason": f"not available: {', '.join(missing)} missing"}
    if impl == "torch":
        import torch

        import bench_torch

        torch.set_num_threads(threads)
        try:
            run = bench_torch.prepare(w, device)
        except bench_torch.Unsupported as e:
            return {"available": False, "reason": f"not available: {e}"}
        flops = None
    elif impl == "jax":
        if threads == 1:  # XLA's way to keep its CPU kernels on one thread (it has no thread count)
            os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        import bench_jax

        try:
            run, flops = bench_jax.prepare(w, device), None
        except bench_jax.Unsupported as e:
            return {"available": False, "reason": f"not available: {e}"}
    elif impl == "numpy":
        import bench_numpy

        try:
            run, flops = bench_numpy.prepare(w, device), None
        except bench_numpy.Unsupported as e:
            return {"available": False, "reason": f"not available: {e}"}
    else:
        import bench_dlrun

        run, flops = bench_dlrun.prepare(w, device)
    run()  # warm-up
    times, cpu, losses = [], [], []
    for _ in range(repeats):
        t, c, loss = run()
        times.append(t)
        cpu.append(c)
        losses.append(loss)
    res = {"available": True, "times": times, "cpu_times": cpu, "final_loss": losses[-1], "gemm_flops": flops}
    if device == "gpu":
        res["gpu_mib"] = gpu_memory_mib(impl)
    return res


def gradcheck(repeats: int) -> dict:
    cmd = [sys.executable, "-m", "dlrun", "gradcheck", "--all"]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    probe = subprocess.run([sys.executable, "-m", "dlrun", "--help"], env=env, capture_output=True, text=True,
                           cwd=HERE.parent)
    if " gradcheck " not in probe.stdout:
        return {"available": False, "reason": "not available: no `dlrun gradcheck` command"}
    times, cpu = [], []
    for i in range(repeats + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE.parent)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            return {"available": False, "reason": f"`dlrun gradcheck --all` exited {p.returncode}"}
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:
            times.append(dt)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {"available": True, "times": times, "cpu_times": cpu, "rss_mib": rss_mib(resource.RUSAGE_CHILDREN)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "gemm", "gradcheck"])
    ap.add_argument("args", nargs="*")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    a = ap.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    if a.mode == "gemm":
        res = gemm_gpu(a.args[0]) if a.device == "gpu" else gemm(a.args[0], threads)
    elif a.mode == "train":
        res = train(a.args[0], a.args[1], threads, a.repeats, a.device)
    else:
        res = gradcheck(a.repeats)
    res.setdefault("rss_mib", rss_mib())
    print(json.dumps(res))


if __name__ == "__main__":
    main()
