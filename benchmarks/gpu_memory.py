"""Where dlrun's GPU memory goes on a benchmark workload, next to PyTorch's on the same one.

    python benchmarks/gpu_memory.py [--workload mlp_gpu] [--steps N]

A CuPy memory hook records every block dlrun takes from CuPy's pool and the line of dlrun that
asked for it. At the peak of live bytes it prints what was live, grouped by that line; then the
pool's size (what CuPy holds from the driver, live or cached for reuse) and, for the same
workload, data and batch size, torch's ``max_memory_allocated`` (its peak of live bytes) and
``max_memory_reserved`` (what its caching allocator held). Live bytes are the fair comparison
of the two programs; held bytes show what each allocator keeps on top.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_dlrun  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

MIB = 2**20


def _site() -> str:
    """The innermost dlrun line on the stack (what asked for the block), else this script's."""
    f = sys._getframe(2)
    fallback = None
    while f is not None:
        name = f.f_code.co_filename
        if f"{os.sep}dlrun{os.sep}" in name:
            return f"{name[name.rindex(os.sep + 'dlrun' + os.sep) + 1:]}:{f.f_lineno} {f.f_code.co_name}"
        if fallback is None and name.startswith(HERE):
            fallback = f"benchmarks/{os.path.basename(name)}:{f.f_lineno} {f.f_code.co_name}"
        f = f.f_back
    return fallback or "?"


def ledger_class(cupy):
    class Ledger(cupy.cuda.MemoryHook):
        """Live pool blocks by the dlrun line that took them; a snapshot at each new peak."""

        name = "dlrun-ledger"

        def __init__(self):
            self.live: dict[int, tuple[int, str, str]] = {}
            self.now = self.peak = 0
            self.phase = "start"
            self.at_peak: dict = {}
            self.peak_phase = ""

        def malloc_postprocess(self, **kw):
            size = kw["mem_size"]
            self.live[kw["mem_ptr"]] = (size, _site(), self.phase)
            self.now += size
            if self.now > self.peak:
                self.peak, self.peak_phase, self.at_peak = self.now, self.phase, dict(self.live)

        def free_postprocess(self, **kw):
            entry = self.live.pop(kw["mem_ptr"], None)
            if entry is not None:
                self.now -= entry[0]

    return Ledger


def dlrun_side(w, steps: int) -> dict:
    import cupy
    from dlrun.training import capture

    pool = cupy.get_default_memory_pool()
    led = ledger_class(cupy)()
    with led:
        led.phase = "build (weights)"
        trainer, x, y, epochs, _ = bench_dlrun.build(w, "gpu")
        led.phase = "data to device"
        x, y = trainer.to_device(x, y)
        led.phase = "training"
        if steps:
            n = min(len(x), steps * w.batch_size)
            trainer.fit(x[:n], y[:n], epochs=1)
        else:  # the whole workload, as torch runs it (an epoch's last, short batch included)
            trainer.fit(x, y, epochs=epochs)
        cupy.cuda.Device().synchronize()
        end_live = led.now
    by_site = defaultdict(lambda: [0, 0, ""])
    for size, site, phase in led.at_peak.values():
        row = by_site[site]
        row[0] += size
        row[1] += 1
        row[2] = phase
    return {"peak_live": led.peak, "peak_phase": led.peak_phase, "end_live": end_live,
            "pool_held": pool.total_bytes() + capture.pool_bytes(), "graph_pools": capture.pool_bytes(), "by_site": sorted(by_site.items(), key=lambda kv: -kv[1][0]),
            "params": sum(int(p.data.nbytes) for _, p in trainer.model.named_parameters()), "data": int(x.nbytes + y.nbytes)}


def torch_side(w) -> dict:
    import torch

    import bench_torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.reset_peak_memory_stats()
    run = bench_torch.prepare(w, "gpu")
    run()
    torch.cuda.synchronize()
    return {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="mlp_gpu", choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int, default=None, help="only this many full batches on the dlrun side (default: "
                                                               "the whole workload, as torch runs it)")
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    w = WORKLOADS[a.workload]
    d = dlrun_side(w, a.steps)
    print(f"== {w.name}: {w.title}")
    print(f"dlrun peak live {d['peak_live'] / MIB:.1f} MiB (reached during {d['peak_phase']}); "
          f"live at the end {d['end_live'] / MIB:.1f} MiB; CuPy pool holds {d['pool_held'] / MIB:.1f} MiB")
    print(f"  parameters {d['params'] / MIB:.1f} MiB, data on the device {d['data'] / MIB:.1f} MiB")
    print("  live at the peak, by the dlrun line that allocated it:")
    for site, (size, count, phase) in d["by_site"][:25]:
        print(f"  {size / MIB:9.1f} MiB {count:5d} blocks  [{phase}] {site}")
    if not a.no_torch:
        t = torch_side(w)
        print(f"torch max_memory_allocated {t['max_allocated'] / MIB:.1f} MiB, "
              f"max_memory_reserved {t['max_reserved'] / MIB:.1f} MiB")
        print(f"ratio dlrun peak live / torch max allocated: {d['peak_live'] / t['max_allocated']:.2f}; "
              f"dlrun pool held / torch reserved: {d['pool_held'] / t['max_reserved']:.2f}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
