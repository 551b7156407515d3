"""Time per batch of the recurrent layers, forward and backward, on the GPU as dlrun runs them (up
to 256 units: one kernel for the whole sequence each way), with the per-step fused
cells (one kernel per time step each way, after the recurrent product) and with the unfused path
(the CPU's array operations on CuPy), next to the CPU.

    python benchmarks/recurrent_gpu.py [--devices gpu,cpu] [--batch 64] [--steps 20] [--units 32]
                                       [--features 2] [--repeats 200] [--dtype float32]

The defaults are the LSTM of configs/adding_lstm.yaml. For each layer (LSTM, GRU, SimpleRNN) and
path: a warm-up batch (it compiles or loads the kernels), then ``--repeats`` batches of forward
and backward on the same input, the device synchronised before the clock starts and after it
stops; printed as milliseconds per batch. ``--fused-only`` times only what dlrun runs; the CPU
uses the BLAS threads ``dlrun train`` would (``--threads`` as its option). The per-step column
is selected here by lowering the layers' limit for their sequence kernels to 0 units, the unfused
one by that and by making the cell kernels unavailable; dlrun itself does neither.
"""
from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np

from dlrun import registry
from dlrun.backend import Kernel, get_backend, threads
from dlrun.layers import gru, lstm, simple_rnn
from dlrun.model import Sequential

CELLS = {"LSTM": "dlrun_lstm_step", "GRU": "dlrun_gru_step", "SimpleRNN": "dlrun_rnn_step"}
SEQUENCE = {"LSTM": lstm, "GRU": gru, "SimpleRNN": simple_rnn}  # each layer's module holds its limit


@contextmanager
def per_step():
    """The layers run their per-step cells at every size (the sequence kernels' limit set to 0 units)."""
    limits = {name: module.SEQUENCE_UNITS for name, module in SEQUENCE.items()}
    for module in SEQUENCE.values():
        module.SEQUENCE_UNITS = 0
    try:
        yield
    finally:
        for name, module in SEQUENCE.items():
            module.SEQUENCE_UNITS = limits[name]


@contextmanager
def unfused():
    """Neither sequence kernels nor cell kernels: the layers take their array-operation path."""
    names = set(CELLS.values()) | {n + "_grad" for n in CELLS.values()}
    real = Kernel.on
    Kernel.on = lambda self, xp: None if self.name in names else real(self, xp)
    try:
        with per_step():
            yield
    finally:
        Kernel.on = real



def per_batch(name, backend, args) -> float:
    """Milliseconds per forward + backward of one batch."""
    layer = registry.layers.build({"type": name, "units": args.units})
    Sequential([layer], (args.steps, args.features), backend, args.dtype, seed=0)
    layer.buffers.enabled = True  # as in training
    rng = np.random.default_rng(0)
    x = backend.asarray(rng.standard_normal((args.batch, args.steps, args.features)).astype(args.dtype))
    dy = backend.asarray(rng.standard_normal((args.batch, args.units)).astype(args.dtype))

    def batch():
        layer.forward(x)
        layer.backward(dy)

    batch()
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        batch()
    backend.synchronize()
    return (time.perf_counter() - t0) / args.repeats * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default="gpu,cpu")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--units", type=int, default=32)
    p.add_argument("--features", type=int, default=2)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--fused-only", action="store_true", help="time only the path dlrun runs")
    p.add_argument("--threads", type=int, default=None, help="the CPU's BLAS threads (as dlrun train --threads)")
    args = p.parse_args()
    blas = threads.limit(args.threads)
    print(f"batch {args.batch}, {args.steps} steps, {args.features} features, {args.units} units, {args.dtype}, "
          f"mean of {args.repeats} batches (forward + backward), ms per batch; CPU with {blas} BLAS thread(s)")
    devices = args.devices.split(",")
    gpu_columns = ["gpu", "gpu per-step", "gpu unfused"]
    columns = [c for d in devices for c in (gpu_columns if d == "gpu" and not args.fused_only else [d])]
    print(f"(gpu: as dlrun runs it; the sequence kernels take up to {lstm.SEQUENCE_UNITS} units)")
    print("| layer | " + " | ".join(columns) + " |")
    for name in CELLS:
        row = []
        for device in devices:
            backend = get_backend(device)
            row.append(f"{per_batch(name, backend, args):.3f}")
            if device == "gpu" and not args.fused_only:
                with per_step():
                    row.append(f"{per_batch(name, backend, args):.3f}")
                with unfused():
                    row.append(f"{per_batch(name, backend, args):.3f}")
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
