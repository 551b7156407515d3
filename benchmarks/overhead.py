"""The framework's own per-step and per-epoch cost, measured where numpy does almost no work.

The spiral workload shrunk to a 2-1-3 network on 3 samples: every numpy call then costs only its
call overhead, so dlrun's time per step minus the hand-written numpy loop's (bench_numpy.py, the
same calls with nothing around them) is what dlrun's Python machinery adds per step: layer and
loss dispatch, buffer lookups, accuracy, the optimizer's bookkeeping, the per-epoch non-finite
guard and history row (one batch per epoch, as in the spiral). A second figure separates the
per-epoch part: ``fit`` for 1000 one-batch epochs against 1000 bare ``train_step`` calls.

    python benchmarks/overhead.py [--runs 15]

Minimum over runs, interleaved in one process; figures depend on the machine (compare rows
measured in the same invocation, or the dlrun/numpy ratio).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import bench_dlrun
import bench_numpy
import workloads


def tiny_spiral(samples: int = 3, hidden: int = 1) -> workloads.Workload:
    base = workloads.WORKLOADS["spiral"]
    full = base.data

    @dataclasses.dataclass
    class Tiny(workloads.Workload):
        def data(self):
            return tuple(a[:samples] for a in full())

    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields["layers"] = [{"type": "Linear", "units": hidden}, "ReLU", {"type": "Linear", "units": 3}]
    return Tiny(**fields)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    w = tiny_spiral()
    run_dlrun, _ = bench_dlrun.prepare(w)
    run_numpy = bench_numpy.prepare(w)
    trainer, x, y, epochs, _ = bench_dlrun.build(w)
    xd, yd = trainer.to_device(x, y)
    fit_t, loop_t, dl_t, np_t = [], [], [], []
    for _ in range(args.runs):
        dl_t.append(run_dlrun()[0])
        np_t.append(run_numpy()[0])
        trainer.epoch = 0
        t0 = time.perf_counter()
        trainer.fit(xd, yd, epochs=epochs)
        fit_t.append(time.perf_counter() - t0)
        trainer.fast_mode(True)
        t0 = time.perf_counter()
        for _ in range(epochs):
            trainer.train_step(xd, yd)
        loop_t.append(time.perf_counter() - t0)
        trainer.fast_mode(False)
    us = 1e6 / epochs
    d, n, f, s = (min(t) * us for t in (dl_t, np_t, fit_t, loop_t))
    print(f"# framework overhead, spiral shrunk to 2-1-3 on {len(x)} samples, {epochs} steps, min of {args.runs}")
    print(f"dlrun fit           {d:7.1f} us/step")
    print(f"hand-written numpy  {n:7.1f} us/step   (the same numpy calls, nothing around them)")
    print(f"dlrun overhead      {d - n:7.1f} us/step   (dlrun/numpy {d / n:.2f})")
    print(f"  of which per epoch {f - s:6.1f} us      (fit {f:.1f} vs bare train_step loop {s:.1f} us/step)")


if __name__ == "__main__":
    main()
