"""Train every shipped config and fingerprint what it produced, to prove a change altered nothing.

    PYTHONPATH=CHECKOUT python benchmarks/identity.py [--output FILE] [--compare BASELINE] [--only NAME ...]

For each of ``configs/*.yaml`` and ``examples/my_layer.yaml`` (in the checkout whose dlrun is
imported: the first ``dlrun`` on ``PYTHONPATH``, else this repository's) it runs
``python -m dlrun train CONFIG --runs-dir TMP`` with the config's own seed, in a subprocess with
that checkout first on the path, and prints one JSON line:

* ``summary``: summary.json without its wall-clock keys (any key naming ``seconds``);
* ``metrics_csv``: the sha256 of metrics.csv without its ``seconds`` column;
* ``last.npz`` / ``best.npz``: per array (``model/*``, ``optimizer/*``), its dtype, shape and the
  sha256 of its bytes; and the deterministic part of the ``meta`` record: ``epoch``, ``step`` and
  ``best`` as values, ``rng``, ``position`` (without its ``seconds``) and ``controls`` as sha256
  of their canonical JSON. Timestamps, paths and versions in ``meta`` are left out.

The first line is a ``meta`` record: the checkout's commit (and whether its tracked files
differ from it), the Python and numpy versions, the thread count. Archives are read with
``numpy.load(allow_pickle=False)``; nothing of dlrun is imported here, so the script works on any
version of the package.

``--compare BASELINE`` (a file an earlier ``--output`` wrote) compares the new records with it and
prints every difference instead of the records (``--output`` still saves them); the exit status
is 1 when there is one (or a run failed), 0 when everything is identical. ``--current FILE``
compares a saved file instead of training again. BLAS results depend on the
CPU and the thread count (at 2 threads digits_mlp and spiral_deep end with other float32 weights
than at 1): compare runs made on one machine with the same ``--threads`` (default 1, which is also
the fastest on a busy 2-core machine).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# --set overrides per config (relative path), for configs too slow to train in full. None needed:
# at one thread every shipped config trains its full epochs in a few seconds (all 12: 11-45 s on
# 2 busy cores; at 2 threads on a loaded machine digits_cnn alone took up to 80 s). Whatever is
# here is recorded in each record, so a baseline and a run with other overrides differ.
OVERRIDES: dict[str, list[str]] = {}

CHECKPOINTS = ("last.npz", "best.npz")
META_VALUES = ("epoch", "step", "best")          # recorded as they are
META_HASHED = ("rng", "position", "controls")    # recorded as sha256 of canonical JSON


def checkout_root() -> Path:
    """The repository holding the dlrun that ``python -m dlrun`` would import (PYTHONPATH first)."""
    spec = importlib.util.find_spec("dlrun")  # finds, does not import
    if spec is None or not spec.origin:
        return HERE.parent
    return Path(spec.origin).resolve().parent.parent


def configs_of(root: Path) -> list[Path]:
    found = sorted((root / "configs").glob("*.yaml"))
    example = root / "examples" / "my_layer.yaml"
    if example.is_file():
        found.append(example)
    return found


def git(root: Path, *args: str) -> str | None:
    p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def is_wall_clock(key: str) -> bool:
    k = key.lower()
    return "seconds" in k


def read_checkpoint(path: Path) -> dict:
    import numpy as np

    out: dict = {"arrays": {}, "meta": {}}
    with np.load(path, allow_pickle=False) as z:
        for name in sorted(z.files):
            a = z[name]
            if name == "meta":
                meta = json.loads(a.tobytes().decode("utf-8"))
                for k in META_VALUES:
                    out["meta"][k] = meta.get(k, "<absent>")
                for k in META_HASHED:
                    v = meta.get(k, "<absent>")
                    if k == "position" and isinstance(v, dict):
                        v = {pk: pv for pk, pv in v.items() if not is_wall_clock(pk)}
                    out["meta"][k] = sha256(canonical(v))
                continue
            a = np.asarray(a, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
            digest = sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())
            out["arrays"][name] = f"{a.dtype} {list(a.shape)} {digest}"
    return out


def metrics_digest(path: Path) -> str:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return sha256(b"")
    keep = [i for i, c in enumerate(rows[0]) if not is_wall_clock(c)]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for r in rows:
        w.writerow([r[i] if i < len(r) else "" for i in keep])
    return sha256(buf.getvalue().encode())


def run_config(root: Path, config: Path, runs: Path, env: dict) -> tuple[dict, float]:
    rel = config.relative_to(root).as_posix()
    overrides = OVERRIDES.get(rel, [])
    args = [sys.executable, "-m", "dlrun", "train", str(config), "--runs-dir", str(runs)]
    for o in overrides:
        args += ["--set", o]
    t0 = time.perf_counter()
    p = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    line: dict = {"config": rel, "overrides": overrides, "exit": p.returncode}
    if p.returncode != 0:
        line["error"] = (p.stderr.strip().splitlines() or ["?"])[-1]
        return line, wall
    run_dir = Path(p.stdout.strip().splitlines()[-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    line["summary"] = {k: v for k, v in summary.items() if not is_wall_clock(k)}
    line["metrics_csv"] = metrics_digest(run_dir / "metrics.csv")
    for name in CHECKPOINTS:
        path = run_dir / "checkpoints" / name
        line[name] = read_checkpoint(path) if path.is_file() else "<absent>"
    return line, wall


def measure(root: Path, only: list[str], threads: int, echo: bool) -> list[dict]:
    import numpy as np

    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    status = git(root, "status", "--porcelain", "--untracked-files=no")
    meta = {"meta": {"root": str(root), "commit": git(root, "rev-parse", "HEAD"),
                     "tracked_files_modified": bool(status) if status is not None else None,
                     "python": platform.python_version(), "numpy": np.__version__, "threads": threads,
                     "machine": platform.machine()}}
    lines = [meta]
    if echo:
        print(json.dumps(meta), flush=True)
    configs = configs_of(root)
    if only:
        configs = [c for c in configs if c.stem in only or c.relative_to(root).as_posix() in only]
    total = 0.0
    with tempfile.TemporaryDirectory(prefix="dlrun-identity-") as tmp:
        for i, config in enumerate(configs):
            line, wall = run_config(root, config, Path(tmp) / str(i), env)
            total += wall
            print(f"{line['config']}: {wall:.1f} s" + (f" (exit {line['exit']}: {line.get('error')})"
                                                       if line["exit"] else ""), file=sys.stderr, flush=True)
            lines.append(line)
            if echo:
                print(json.dumps(line), flush=True)
    print(f"total: {total:.1f} s for {len(configs)} configs", file=sys.stderr)
    return lines


def load(path: Path) -> list[dict]:
    """What --output wrote (a JSON array, one record a line), or the JSON lines printed."""
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(l) for l in text.splitlines() if l.strip()]
    return data if isinstance(data, list) else [data]


def _diff(where: str, a, b, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in b:
                out.append(f"{where}.{k}: only in the baseline ({json.dumps(a[k])[:120]})")
            elif k not in a:
                out.append(f"{where}.{k}: only in the new run ({json.dumps(b[k])[:120]})")
            else:
                _diff(f"{where}.{k}", a[k], b[k], out)
    elif a != b or type(a) is not type(b):
        note = ""
        if isinstance(a, float) and isinstance(b, float) and a != 0:
            note = f" (relative {abs(b - a) / abs(a):.3g})"
        out.append(f"{where}: {json.dumps(a)} -> {json.dumps(b)}{note}")


def compare(baseline: list[dict], current: list[dict], only: list[str]) -> list[str]:
    base = {l["config"]: l for l in baseline if "config" in l}
    new = {l["config"]: l for l in current if "config" in l}
    if only:
        base = {k: v for k, v in base.items() if Path(k).stem in only or k in only}
    diffs: list[str] = []
    for name in sorted(set(base) | set(new)):
        if name not in new:
            diffs.append(f"{name}: in the baseline, not run now")
        elif name not in base:
            diffs.append(f"{name}: not in the baseline")
        else:
            a = {k: v for k, v in base[name].items() if k != "config"}
            b = {k: v for k, v in new[name].items() if k != "config"}
            _diff(name, a, b, diffs)
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, help="also write the records to this file (a JSON array, one a line)")
    ap.add_argument("--compare", type=Path, metavar="BASELINE", help="report every difference from this file; exit 1 if any")
    ap.add_argument("--current", type=Path, metavar="FILE", help="with --compare: compare this saved file instead of training")
    ap.add_argument("--only", nargs="+", default=[], metavar="NAME", help="only these configs (stem or path: spiral, configs/iris.yaml)")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP/OPENBLAS/MKL_NUM_THREADS for the runs (default 1: a matmul's float32 rounding depends on "
                         "how BLAS splits it, so a baseline and a comparison must use the same count)")
    args = ap.parse_args(argv)
    if args.current and not args.compare:
        ap.error("--current needs --compare")
    if args.current:
        lines = load(args.current)
    else:
        lines = measure(checkout_root(), args.only, args.threads, echo=not args.compare)
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text("[\n" + ",\n".join(json.dumps(l) for l in lines) + "\n]\n")
    failed = [l["config"] for l in lines if l.get("exit")]
    if not args.compare:
        return 1 if failed else 0
    baseline = load(args.compare)
    bmeta = next((l["meta"] for l in baseline if "meta" in l), {})
    nmeta = next((l["meta"] for l in lines if "meta" in l), {})
    print(f"\nbaseline: commit {bmeta.get('commit')}; now: commit {nmeta.get('commit')}"
          f"{' with modified tracked files' if nmeta.get('tracked_files_modified') else ''}", file=sys.stderr)
    for k in ("python", "numpy", "threads", "machine"):
        if bmeta.get(k) != nmeta.get(k):
            print(f"note: {k} differs ({bmeta.get(k)} -> {nmeta.get(k)}): results may differ for that reason",
                  file=sys.stderr)
    diffs = compare(baseline, lines, args.only)
    for d in diffs:
        print(d)
    n = len({l["config"] for l in lines if "config" in l})
    print(f"{len(diffs)} difference(s)" if diffs else f"identical: {n} configs", file=sys.stderr)
    return 1 if diffs or failed else 0


if __name__ == "__main__":
    sys.exit(main())
