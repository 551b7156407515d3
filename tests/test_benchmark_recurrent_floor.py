"""benchmarks/recurrent_floor.py: the layer's side (its own products recorded and replayed) on the lstm workload."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_layers_products_are_recorded_and_replayed():
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recurrent_floor.py"), "--side", "lstm",
                        "--repeats", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    n, steps, d, h = 64, 20, 16, 64  # the lstm workload: batch, steps, features, units
    assert r["batches"] == 32 and r["calls"] >= 2 * steps - 1  # a product per step each way at least
    # what any LSTM's products must do: W x_t and U h_{t-1} forward (h_0 = 0), U^T da_t backward,
    # and dW, dU from the gates' errors
    essential = 2 * n * 4 * h * (2 * (d * steps + h * (steps - 1)) + h * (steps - 1))
    assert essential <= r["gflop"] * 1e9 <= 1.05 * essential
    assert r["layer"] > 0 and r["products"] > 0 and r["peak_gflops"] > 0
