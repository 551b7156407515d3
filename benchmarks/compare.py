"""Time one workload on several versions of dlrun, alternating processes, to measure a change.

    python benchmarks/compare.py cnn HEAD~2 HEAD~1 WORKTREE [--rounds 5] [--repeats 5] [--threads 2] [--clock cpu]

Each version is a git revision (checked out into a temporary worktree, removed afterwards) or
``WORKTREE`` for the files as they are now. A round runs every version once, each in its own
process (``benchmarks/worker.py`` of that version, so that version's dlrun), one untimed warm-up
then ``--repeats`` timed fits. Versions alternate within each round, so a slow spell of the
machine hits all of them rather than one. Prints, per version, the median and the minimum over
all timed fits, and the change of each against the first version. ``--clock cpu`` compares the
processes' CPU time instead of wall time (steadier on a machine shared with other work).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
from run import spawn  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


def checkout(rev: str, tmp: Path) -> Path:
    """The repository root holding version ``rev``: this one for WORKTREE, else a new worktree."""
    if rev == "WORKTREE":
        return HERE.parent
    path = tmp / rev.replace("/", "_").replace("~", "-").replace("^", "-")
    subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach", "-q", str(path), rev],
                   check=True, capture_output=True, text=True)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("versions", nargs="+", help="git revisions, or WORKTREE for the current files")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="compare wall time (default) or process CPU time (steadier on a busy machine at 1 thread)")
    args = ap.parse_args(argv)
    key = "times" if args.clock == "wall" else "cpu_times"
    with tempfile.TemporaryDirectory(prefix="dlrun-compare-") as tmp:
        roots = {}
        try:
            for v in args.versions:
                try:
                    roots[v] = checkout(v, Path(tmp))
                except subprocess.CalledProcessError as e:
                    print(f"compare.py: cannot check out {v!r}: {e.stderr.strip().splitlines()[-1]}", file=sys.stderr)
                    return 2
            times: dict[str, list[float]] = {v: [] for v in args.versions}
            for r in range(args.rounds):
                for v, root in roots.items():
                    res = spawn(["train", "dlrun", args.workload, "--repeats", str(args.repeats)], args.threads,
                                worker=root / "benchmarks" / "worker.py")
                    if not res.get("available"):
                        print(f"{v}: {res.get('reason')}", file=sys.stderr)
                        return 1
                    times[v] += [t * 1e3 for t in res[key]]
                    print(f"round {r + 1}/{args.rounds} {v:12s} {statistics.median(res[key]) * 1e3:8.1f} ms",
                          flush=True)
        finally:
            for v, root in roots.items():
                if root != HERE.parent:
                    subprocess.run(["git", "-C", str(HERE.parent), "worktree", "remove", "--force", str(root)],
                                   capture_output=True)
    first = args.versions[0]
    m0, n0 = statistics.median(times[first]), min(times[first])
    print(f"\n{args.workload}: {args.rounds} rounds x {args.repeats} fits per version, {args.threads} threads "
          f"({args.clock} time, ms)")
    print(f"{'version':14s} {'median':>8s} {'min':>8s} {'vs ' + first:>18s}")
    for v, ts in times.items():
        m, n = statistics.median(ts), min(ts)
        print(f"{v:14s} {m:8.1f} {n:8.1f} {100 * (m / m0 - 1):+8.1f}% / {100 * (n / n0 - 1):+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
