"""How many BLAS threads dlrun should use: `dlrun train` timed at several --threads, on a quiet
machine and on one made busy by CPU-burning processes.

    python benchmarks/threads.py [--configs digits_cnn,spiral] [--threads 1,2] [--busy 2] [--rounds 3]

Each round runs every (condition, config, threads) once, in its own process, in an order that
alternates between rounds; "busy" starts ``--busy`` processes that spin on the CPU for the
condition and stops them after it. The figure is the training time summary.json records (the
process's start-up and the data loading excluded), median and range over the rounds. With
``--threads`` equal to the number of cores the BLAS library runs as it would on its own (one
thread per core). A machine that others share is never quite quiet: note its load (printed).
Results go to benchmarks/results/threads-<timestamp>.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BURN = "while True: pass"


def train_seconds(config: str, threads: int, runs_dir: Path) -> tuple[float, float]:
    """(training seconds from summary.json, wall seconds of the whole command) of one run."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "DLRUN_THREADS"):
        env.pop(k, None)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "dlrun", "train", str(ROOT / "configs" / f"{config}.yaml"),
                        "--threads", str(threads), "--runs-dir", str(runs_dir)],
                       env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"dlrun train {config} --threads {threads} failed:\n{p.stderr}")
    run_dir = Path(p.stdout.strip().splitlines()[-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["threads"] == threads, (summary["threads"], threads)
    return summary["seconds"], wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="digits_cnn,spiral")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--busy", type=int, default=2, help="CPU-burning processes for the busy condition")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conditions", default="quiet,busy")
    args = ap.parse_args()
    configs, counts = args.configs.split(","), [int(t) for t in args.threads.split(",")]
    conditions = args.conditions.split(",")
    times: dict = {}
    load = {c: [] for c in conditions}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for condition in conditions:
                burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.busy)] \
                    if condition == "busy" else []
                try:
                    time.sleep(1.0 if burners else 0.0)
                    load[condition].append(os.getloadavg()[0])
                    order = counts if r % 2 == 0 else counts[::-1]
                    for config in configs:
                        for t in order:
                            s, wall = train_seconds(config, t, Path(tmp))
                            times.setdefault((condition, config, t), []).append((s, wall))
                            print(f"round {r + 1} {condition:5} {config:12} --threads {t}: {s:7.2f} s "
                                  f"(command {wall:.2f} s)", flush=True)
                finally:
                    for b in burners:
                        b.kill()
                        b.wait()
    lines = [f"# BLAS threads: dlrun train, {datetime.now():%Y-%m-%d %H:%M}",
             "", f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}; {args.rounds} rounds; busy = {args.busy} CPU-burning processes; "
             f"1-minute load average at the start of each condition: "
             + "; ".join(f"{c} {', '.join(f'{x:.1f}' for x in v)}" for c, v in load.items()),
             "", "| machine | config | --threads | training seconds, median (min-max) | command seconds, median |",
             "|---|---|---:|---:|---:|"]
    for (condition, config, t), v in times.items():
        s = [x[0] for x in v]
        w = [x[1] for x in v]
        lines.append(f"| {condition} | {config} | {t} | {statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f}) | "
                     f"{statistics.median(w):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = HERE / "results" / f"threads-{datetime.now():%Y%m%d-%H%M%S}.md"
    out.write_text(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
