"""Time and peak memory of reading tabular data, and of `dlrun check` and `dlrun train` on it.

    python benchmarks/tabular_data.py /tmp/tabular                 # writes the files (20k, 200k, 2M rows)
    python benchmarks/data_loading.py /tmp/tabular [--rounds 3] [--rows 20000,200000,2000000]

Every measurement is a fresh process (`python -c` reading the file with the `file` loader, or
the `dlrun` command), timed from outside, its peak resident memory (ru_maxrss) from os.wait4.
Each is run ``--rounds`` times; the table shows the minimum of each (the machine may be shared:
CPU seconds, user + system, suffer less from other processes than wall seconds).
"read" is the loader alone (load_file: parse, checks, labels); "check" and "train" are the
commands on the configs tabular_data.py wrote (one epoch of softmax regression, batch 512, 10 %
held out). "start" is a process that imports dlrun and reads a 3-line CSV: subtract it from a
peak to get what the data cost. Prints a Markdown table; results also go to --json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READ = "import json, sys; from dlrun.data.files import load_file; load_file(sys.argv[1], **json.loads(sys.argv[2]))"

# (name, file suffix, loader options, config kind); python's row-by-row scan only up to 200k rows
KINDS = [("csv pyarrow", ".csv", {"csv_parser": "pyarrow"}, None),
         ("csv numpy", ".csv", {"csv_parser": "numpy"}, None),
         ("csv python", ".csv", {"csv_parser": "python"}, None),
         ("csv (auto)", ".csv", {}, "csv"),
         ("npy", ".npy", {"memory_map": False}, "npy"),
         ("npz", ".npz", {}, "npz"),
         ("npy memory_map", ".npy", {"memory_map": True}, "mmap")]


def measure(argv: list[str], cwd: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds (user + system), peak RSS in MB) of one process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--rows", default="20000,200000,2000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    d = a.directory.resolve()
    py = sys.executable
    tiny = d / "tiny.csv"
    tiny.write_text("1,2,0\n3,4,1\n5,6,0\n")
    jobs = [("start", "read", 0, [py, "-c", READ, str(tiny), "{}"])]
    for rows in (int(r) for r in a.rows.split(",")):
        for name, suffix, options, config in KINDS:
            if name == "csv python" and rows > 200_000:
                continue
            path = d / f"tabular-{rows}{suffix}"
            if config is None or name == "npy" or name.startswith("npy memory"):
                jobs.append((name, "read", rows, [py, "-c", READ, str(path), json.dumps(options)]))
            if config is not None:
                cfg = str(d / f"tabular-{rows}-{config}.yaml")
                jobs.append((name, "check", rows, [py, "-m", "dlrun", "check", cfg]))
                jobs.append((name, "train", rows, [py, "-m", "dlrun", "train", cfg, "--runs-dir", str(d / "runs")]))
    results: dict[tuple, list] = {}
    for r in range(a.rounds):  # rounds interleave the kinds: a busy spell of the machine hits all alike
        for name, what, rows, argv in jobs:
            results.setdefault((name, what, rows), []).append(measure(argv, d))
            wall, cpu, rss = results[(name, what, rows)][-1]
            print(f"round {r + 1}: {name:15s} {what:5s} {rows:>9,} rows  {wall:7.2f} s {cpu:7.2f} s CPU {rss:7.0f} MB",
                  file=sys.stderr, flush=True)
    print("| data | rows | command | wall s (min) | CPU s (min) | peak RSS MB (min) |\n|---|---:|---|---:|---:|---:|")
    for (name, what, rows), runs in results.items():
        print(f"| {name} | {rows:,} | {what} | {min(r[0] for r in runs):.2f} | {min(r[1] for r in runs):.2f} | "
              f"{min(r[2] for r in runs):.0f} |")
    if a.json:
        a.json.write_text(json.dumps([{"data": n, "command": w, "rows": r, "runs": v} for (n, w, r), v in results.items()],
                                     indent=1))


if __name__ == "__main__":
    main()
