"""The framework's own per-step and per-epoch cost, measured where numpy does almost no work.

The spiral workload shrunk to a 2-1-3 network on 3 samples: every numpy call then costs only its
call overhead, so dlrun's time per step minus the hand-written numpy loop's (bench_numpy.py, the
same calls with nothing around them) is what dlrun's Python machinery adds per step: layer and
loss dispatch, buffer lookups, accuracy, the optimizer's bookkeeping, the per-epoch non-finite
guard and history row (one batch per epoch, as in the spiral). A second figure separates the
per-epoch part: ``fit`` for 1000 one-batch epochs against 1000 bare ``train_step`` calls.

    python benchmarks/overhead.py [--runs 15] [--graph-nodes 20] [--clock cpu]

Minimum over runs, interleaved in one process; figures depend on the machine (compare rows
measured in the same invocation, or the dlrun/numpy ratio). ``--clock cpu`` times the process's
CPU time instead of wall time: on a machine shared with other work it is much less disturbed.

A third figure is what a graph model costs per node over the same chain written as a list: a
chain of ``--graph-nodes`` tiny nodes (Linear with one unit and ReLU, alternating, then a Linear
to the 3 classes), once as a list (a Sequential) and once with every entry naming its input
(``inputs: [previous]``: the same chain as a Graph), each trained step by step on 3 samples in
the trainer's fast mode; (graph − list) / nodes is the executor's own cost per node.
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


def chain_specs(nodes: int, named: bool) -> list:
    """``nodes`` layers: Linear(1) and ReLU alternating, then Linear(3); ``named``: each entry
    reads the one before it by name (``inputs:``), which makes the same chain a graph model."""
    specs = [{"type": "Linear", "units": 1} if i % 2 == 0 else {"type": "ReLU"} for i in range(nodes - 1)]
    specs.append({"type": "Linear", "units": 3})
    if named:
        for i, spec in enumerate(specs):
            spec.update(name=f"n{i}", inputs=["input" if i == 0 else f"n{i - 1}"])
    return specs


def chain_trainer(nodes: int, named: bool):
    from dlrun.config import config_from_dict
    from dlrun.runs.assembly import assemble

    cfg = config_from_dict({"seed": 0, "data": {"type": "spiral", "points_per_class": 1},
                            "model": chain_specs(nodes, named), "loss": "SoftmaxCrossEntropy",
                            "optimizer": {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9}})
    run = assemble(cfg)
    t = run.trainer
    x, y = t.to_device(run.data.x, run.data.y)
    t.fast_mode(True)
    t.train_step(x, y)  # the checked first step
    return t, x, y


def graph_overhead(nodes: int, runs: int, steps: int = 2000, clock=time.perf_counter) -> None:
    """Per-step time of the same chain as a list and as a graph; the difference per node."""
    (tc, xc, yc), (tg, xg, yg) = chain_trainer(nodes, False), chain_trainer(nodes, True)
    assert type(tc.model).__name__ == "Sequential" and type(tg.model).__name__ == "Graph"
    chain_t, graph_t = [], []
    for _ in range(runs):
        for t, x, y, into in ((tc, xc, yc, chain_t), (tg, xg, yg, graph_t)):
            t0 = clock()
            for _ in range(steps):
                t.train_step(x, y)
            into.append(clock() - t0)
    c, g = (min(t) * 1e6 / steps for t in (chain_t, graph_t))
    print(f"# graph executor, a chain of {nodes} nodes on 3 samples, {steps} steps, min of {runs}")
    print(f"as a list (Sequential)   {c:7.1f} us/step")
    print(f"as a graph (inputs:)     {g:7.1f} us/step")
    print(f"graph overhead           {(g - c) / nodes:7.2f} us/node/step  (graph/list {g / c:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--graph-nodes", type=int, default=20, help="nodes of the graph-versus-list chain (0: skip)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="time wall time (default) or the process's CPU time (steadier on a busy machine)")
    args = ap.parse_args()
    cpu = args.clock == "cpu"
    clock = time.process_time if cpu else time.perf_counter
    w = tiny_spiral()
    run_dlrun, _ = bench_dlrun.prepare(w)
    run_numpy = bench_numpy.prepare(w)
    trainer, x, y, epochs, _ = bench_dlrun.build(w)
    xd, yd = trainer.to_device(x, y)
    fit_t, loop_t, dl_t, np_t = [], [], [], []
    for _ in range(args.runs):
        dl_t.append(run_dlrun()[cpu])  # (wall seconds, CPU seconds, loss)
        np_t.append(run_numpy()[cpu])
        trainer.epoch = 0
        t0 = clock()
        trainer.fit(xd, yd, epochs=epochs)
        fit_t.append(clock() - t0)
        trainer.fast_mode(True)
        t0 = clock()
        for _ in range(epochs):
            trainer.train_step(xd, yd)
        loop_t.append(clock() - t0)
        trainer.fast_mode(False)
    us = 1e6 / epochs
    d, n, f, s = (min(t) * us for t in (dl_t, np_t, fit_t, loop_t))
    print(f"# framework overhead, spiral shrunk to 2-1-3 on {len(x)} samples, {epochs} steps, min of {args.runs}"
          f"{', CPU time' if cpu else ''}")
    print(f"dlrun fit           {d:7.1f} us/step")
    print(f"hand-written numpy  {n:7.1f} us/step   (the same numpy calls, nothing around them)")
    print(f"dlrun overhead      {d - n:7.1f} us/step   (dlrun/numpy {d / n:.2f})")
    print(f"  of which per epoch {f - s:6.1f} us      (fit {f:.1f} vs bare train_step loop {s:.1f} us/step)")
    if args.graph_nodes:
        graph_overhead(args.graph_nodes, args.runs, clock=clock)


if __name__ == "__main__":
    main()
