"""Where a short run's wall time goes: start-up (imports, CUDA context, kernel compilation) against
the training steps, on the GPU and on the CPU.

    python benchmarks/gpu_startup.py configs/spiral.yaml configs/adding_lstm.yaml [--devices gpu,cpu]

For each config and device it starts fresh processes that run ``dlrun.runs.run.train`` (what
``dlrun train`` runs) and time each phase; on the GPU twice, first with an empty CuPy kernel
cache (``CUPY_CACHE_DIR``: every kernel compiled by NVRTC) and then with the cache the first run
filled (what every later run on the machine sees). One table row per run:

- ``process``: the whole process, interpreter start to exit;
- ``imports``: importing dlrun's training modules; ``device``: everything CUDA costs before the
  first step, split in the second table into importing CuPy, ``cuInit`` (the first runtime call),
  creating the context (the first allocation), the cuBLAS handle, and the first elementwise
  kernel (loaded from the cache); the last column says whether the run imported ``cupyx.scipy``
  or SciPy, which CuPy does the first time an array goes through numpy's ufunc dispatch
  (``x * 2``, ``x > 0``; dlrun's own code avoids it);
- ``first step``: building the run and the first training step (kernel compilation or loading);
- ``epoch 1``: the rest of the first epoch; ``per step``: the mean step time over the later
  epochs (validation included), the cost that a longer run multiplies;
- ``kernels``: kernels compiled into the cache by that run.

Every process runs with a Python bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary folder,
filled by a first, untimed run), as an installed package has: an image that sets
``PYTHONDONTWRITEBYTECODE`` would otherwise compile every module from source in every process
(about 0.4 s on the CPU, 0.7 s with CuPy), on both sides of the comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import dlrun.runs.run as R
from dlrun.config import load_config
from dlrun.backend import get_backend
from dlrun.training.hooks import Callback
t_imports = time.perf_counter()
config_path, device, runs = sys.argv[1:4]
parts, t = {}, time.perf_counter()

def lap(name):
    global t
    now = time.perf_counter()
    parts[name], t = now - t, now

if device == "gpu":
    import cupy  # noqa: F401
    lap("import cupy")
b = get_backend(device)  # on the GPU: asks CUDA for its devices, the first runtime call
if device == "gpu":
    lap("cuInit")
    one = b.xp.zeros(1)
    b.synchronize()
    lap("context")
    b.xp.cuda.device.get_cublas_handle()
    lap("cuBLAS")
    (1.0 + one).sum()
    b.synchronize()
    lap("first kernel")
t_device = time.perf_counter()
marks = {}

class Timer(Callback):
    def on_train_begin(self, trainer):
        self.steps = 0
        marks["begin"] = time.perf_counter()
    def on_batch_end(self, epoch, batch):
        self.steps += 1
        if self.steps == 1:
            b.synchronize()
            marks["first"] = time.perf_counter()
    def on_epoch_end(self, epoch, metrics):
        b.synchronize()
        marks.setdefault("epochs", []).append((time.perf_counter(), self.steps))

cfg = load_config(config_path, [f"device={device}"])
R.train(cfg, runs, callbacks=[Timer()])
b.synchronize()
t_end = time.perf_counter()
ep = marks["epochs"]
later = (ep[-1][0] - ep[0][0]) / max(1, ep[-1][1] - ep[0][1]) if len(ep) > 1 else float("nan")
print(json.dumps({"imports": t_imports - t0, "device": t_device - t_imports,
                  "first step": marks["first"] - t_device, "epoch 1": ep[0][0] - marks["first"],
                  "per step": later, "steps": ep[-1][1], "train": t_end - t_device, "parts": parts,
                  "scipy": any(m == "scipy" or m.startswith("cupyx.scipy") for m in sys.modules)}))
"""


def _kernels(cache: str) -> int:
    return sum(len(files) for _, _, files in os.walk(cache))


def _env(cache: str, pycache: str) -> dict:
    env = dict(os.environ, CUPY_CACHE_DIR=cache, PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure(config: str, device: str, cache: str, runs: str, pycache: str) -> dict:
    env = _env(cache, pycache)
    before = _kernels(cache)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, config, device, runs], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    row = json.loads(p.stdout.strip().splitlines()[-1])
    row["process"] = wall
    row["kernels"] = _kernels(cache) - before
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--devices", default="gpu,cpu")
    ap.add_argument("--cache", help="a kernel cache directory to use for every GPU run instead of a fresh, empty "
                                    "one per config (the first run then compiles only what the cache lacks)")
    a = ap.parse_args()
    cols = ["process", "imports", "device", "first step", "epoch 1", "per step"]
    print(f"| config | run | {' | '.join(cols)} | steps | kernels |")
    print("|---|---|" + "---|" * (len(cols) + 2))
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        pycache = os.path.join(tmp, "pycache")
        # untimed: compile every module the runs import into the bytecode cache
        warm = "import dlrun.runs.run, dlrun.cli" + ("; import cupy, cupyx" if "gpu" in a.devices else "")
        subprocess.run([sys.executable, "-c", warm], env=_env(tmp, pycache), check=True)
        for config in a.configs:
            name = os.path.splitext(os.path.basename(config))[0]
            cache = a.cache or tempfile.mkdtemp(dir=tmp)  # empty: every kernel compiled
            for device in a.devices.split(","):
                first = "gpu, given cache" if a.cache else "gpu, cold cache"
                kinds = [first, "gpu, warm cache"] if device == "gpu" else ["cpu"]
                for kind in kinds:
                    r = measure(config, device, cache, os.path.join(tmp, "runs"), pycache)
                    if "error" in r:
                        print(f"| {name} | {kind} | failed: {r['error']} |")
                        continue
                    cells = " | ".join(f"{r[c] * 1000:.2f} ms" if c == "per step" else f"{r[c]:.2f} s" for c in cols)
                    print(f"| {name} | {kind} | {cells} | {r['steps']} | {r['kernels'] if device == 'gpu' else ''} |",
                          flush=True)
                    if r["parts"]:
                        parts.append((name, kind, {**r["parts"], "SciPy imported": "yes" if r["scipy"] else "no"}))
    if parts:
        names = list(parts[0][2])
        print(f"\nThe device column, part by part:\n\n| config | run | {' | '.join(names)} |")
        print("|---|---|" + "---|" * len(names))
        for name, kind, p in parts:
            print(f"| {name} | {kind} | " + " | ".join(p[k] if isinstance(p[k], str) else f"{p[k]:.3f} s"
                                                      for k in names) + " |")


if __name__ == "__main__":
    main()
