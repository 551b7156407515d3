"""Data-parallel scaling: digits_cnn and the MNIST-sized MLP on 1 and 2 ranks, one thread each.

    python benchmarks/scaling.py [--ranks 1 2] [--repeats 3] [--output FILE]

For each workload and rank count K it starts ``mpiexec -n K python benchmarks/scaling.py --worker
NAME`` (K = 1: one plain process, as a user without mpiexec runs it) with one BLAS/OpenMP thread
per rank. The worker builds the workload with dlrun's own machinery (``bench_dlrun.build``: the
shipped config through ``assemble``, or the registry-built MLP), trains one untimed epoch, then
times ``Trainer.fit`` from the same initial weights, ``--repeats`` times, and rank 0 prints one
JSON line: the best wall-clock seconds, the samples trained on, and the seconds spent in the
gradients' allreduce (``World.seconds``) by the rank that spent least there: every other rank's
figure also holds its waits for the slowest rank to finish its part.
The table gives samples per second, the efficiency against K times the one-rank rate, and the
share of the step time spent in the allreduce. The global batch is the same at every K (each
rank computes 1/K of every batch), so K ranks take the same optimizer steps as one process.

A busy machine (other processes on the cores the ranks need) lowers the figures: say so with them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from workloads import WORKLOADS  # noqa: E402

SCALING = {"digits_cnn": "digits_cnn", "mlp": "mlp"}  # the shipped CNN config; MLP 784-512-512-10, batch 128


def worker(name: str, repeats: int) -> None:
    from dlrun import parallel
    from bench_dlrun import build

    world = parallel.join()
    trainer, x, y, epochs, _ = build(WORKLOADS[name], "cpu", world)
    model, opt = trainer.model, trainer.optimizer
    init = {k: v.copy() for k, v in model.state_arrays().items()}
    opt0 = {k: v.copy() for k, v in opt.state_dict().items()}
    xd, yd = trainer.to_device(x, y)
    best, spent = float("inf"), 0.0
    for r in range(repeats + 1):  # the first: warm-up, untimed
        model.load_state_arrays(init)
        opt.load_state_dict(opt0)
        trainer.epoch = trainer.step = 0
        before = world.seconds
        t0 = time.perf_counter()
        trainer.fit(xd, yd, epochs=epochs)
        seconds = time.perf_counter() - t0
        if r and seconds < best:
            best, spent = seconds, world.seconds - before
    least = min(world.comm.allgather(spent)) if world.size > 1 else 0.0
    if world.rank == 0:
        print(json.dumps({"workload": name, "ranks": world.size, "seconds": best, "samples": len(x) * epochs,
                          "allreduce_seconds": least, "steps": trainer.step}), flush=True)


def measure(name: str, ranks: int, repeats: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(Path(__file__)), "--worker", name, "--repeats", str(repeats)]
    if ranks > 1:
        mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
        if mpiexec is None:
            sys.exit("mpiexec not found: pip install -e '.[mpi]'")
        cmd = [mpiexec, "-n", str(ranks)] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> str:
    one = {r["workload"]: r["samples"] / r["seconds"] for r in results if r["ranks"] == 1}
    lines = ["| workload | ranks | samples/s | efficiency | allreduce share of the time |", "|---|---|---|---|---|"]
    for r in results:
        rate = r["samples"] / r["seconds"]
        eff = rate / (r["ranks"] * one[r["workload"]]) if r["workload"] in one else float("nan")
        lines.append(f"| {WORKLOADS[r['workload']].title} | {r['ranks']} | {rate:,.0f} | {eff:.0%} | "
                     f"{r['allreduce_seconds'] / r['seconds']:.0%} ({r['allreduce_seconds']:.3f} s) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="+", choices=sorted(SCALING), default=sorted(SCALING))
    ap.add_argument("--output", type=Path, help="also write the results as JSON")
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.repeats)
        return
    results = [measure(SCALING[n], k, a.repeats) for n in a.only for k in a.ranks]
    print(table(results))
    if a.output:
        a.output.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
                                        "results": results}, indent=1))


if __name__ == "__main__":
    main()
