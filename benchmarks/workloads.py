"""The benchmark workloads: sizes, data and hyper-parameters shared by the dlrun and torch workers.

Each workload is described once, as dlrun layer specs (the same dicts a YAML config holds);
the torch worker builds the equivalent torch modules from the built dlrun model and copies its
initial weights, so both sides start from identical numpy-drawn weights and see the same data
in the same batch order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Workload:
    name: str
    title: str
    layers: list = field(default_factory=list)   # dlrun layer specs; None entries resolved later
    input_shape: tuple = ()
    batch_size: int | None = None
    epochs: int = 1
    learning_rate: float = 0.01
    momentum: float = 0.9
    seed: int = 0
    config: str | None = None                    # a shipped config instead of layers/data
    overrides: tuple = ()
    needs: tuple = ()                            # layer names that must be registered
    samples: int = 0                             # generated data: how many samples (0: the CPU size)

    def data(self):
        """Host float32 inputs and int64 labels."""
        rng = np.random.default_rng(1234)
        if self.name.startswith("spiral"):
            from dlrun.data import spiral

            ds = spiral(classes=3, points_per_class=100, noise=0.2, seed=0)
            return ds.x.astype(np.float32), ds.y
        if self.name.startswith("mlp"):
            n = self.samples or 10_000
            return rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n)
        if self.name.startswith("lstm"):
            n = self.samples or 64 * 32
            return rng.standard_normal((n,) + self.input_shape, dtype=np.float32), rng.integers(0, 10, n)
        if self.name.startswith("cnn"):
            n = self.samples or 64 * 20
            return rng.standard_normal((n,) + self.input_shape, dtype=np.float32), rng.integers(0, 10, n)
        raise KeyError(self.name)


WORKLOADS = {
    "spiral": Workload("spiral", "(a) spiral MLP 2-100-3, full batch 300, 1000 steps",
                       [{"type": "Linear", "units": 100}, "ReLU", {"type": "Linear", "units": 3}],
                       (2,), None, 1000, 0.5),
    "mlp": Workload("mlp", "(b) MLP 784-512-512-10, batch 128, 1 epoch of 10k",
                    [{"type": "Linear", "units": 512}, "ReLU", {"type": "Linear", "units": 512}, "ReLU",
                     {"type": "Linear", "units": 10}], (784,), 128, 1, 0.01),
    "cnn": Workload("cnn", "(c) conv 3x3x8 + ReLU + maxpool 2 + Linear, batch 64, 20 steps",
                    ["conv", "ReLU", "pool", "Flatten", {"type": "Linear", "units": 10}],
                    (1, 28, 28), 64, 1, 0.01, needs=("Conv2D", "MaxPool2D", "Flatten")),
    "digits_cnn": Workload("digits_cnn", "configs/digits_cnn.yaml, 2 epochs, no validation",
                           config=str(ROOT / "configs" / "digits_cnn.yaml"), overrides=("train.epochs=2",),
                           needs=("Conv2D", "MaxPool2D")),
    "lstm": Workload("lstm", "(e) LSTM 64 over 20 steps of 16 features + Linear, batch 64, 32 steps",
                     [{"type": "LSTM", "units": 64}, {"type": "Linear", "units": 10}], (20, 16), 64, 1, 0.01,
                     needs=("LSTM",)),
    # GPU: the same kinds of network scaled up until the GPU, not the Python launch loop, is busy
    "spiral_gpu": Workload("spiral_gpu", "(a) spiral MLP 2-100-3, full batch 300, 1000 steps (launch-bound)",
                           [{"type": "Linear", "units": 100}, "ReLU", {"type": "Linear", "units": 3}],
                           (2,), None, 1000, 0.5),
    "mlp_gpu": Workload("mlp_gpu", "(b') MLP 784-4096-4096-10, batch 1024, 1 epoch of 60k",
                        [{"type": "Linear", "units": 4096}, "ReLU", {"type": "Linear", "units": 4096}, "ReLU",
                         {"type": "Linear", "units": 10}], (784,), 1024, 1, 0.01, samples=60_000),
    "cnn_gpu": Workload("cnn_gpu", "(c') conv 3x3x64 + ReLU + maxpool 2 + Linear on 3x32x32, batch 256, 100 steps",
                        ["conv64", "ReLU", "pool", "Flatten", {"type": "Linear", "units": 10}],
                        (3, 32, 32), 256, 1, 0.01, needs=("Conv2D", "MaxPool2D", "Flatten"), samples=256 * 100),
}
CPU_DEFAULT = ("spiral", "mlp", "cnn", "digits_cnn")
GPU_DEFAULT = ("spiral_gpu", "mlp_gpu", "cnn_gpu", "digits_cnn")


def _pick(options: list[str], candidates: tuple[str, ...], what: str) -> str:
    for c in candidates:
        if c in options:
            return c
    raise KeyError(f"no option for {what} among {options}")


def resolve_layers(specs: list) -> list:
    """Replace the "conv"/"pool" placeholders by specs using the registered layers' option names."""
    from dlrun import registry

    out = []
    for s in specs:
        if s in ("conv", "conv64"):
            opts = [o.name for o in registry.layers.options("Conv2D")]
            filters = 64 if s == "conv64" else 8
            s = {"type": "Conv2D", _pick(opts, ("filters", "out_channels", "channels", "units"), "filters"): filters,
                 _pick(opts, ("kernel_size", "kernel", "size"), "kernel size"): 3}
            if "padding" in opts:
                s["padding"] = 0
        elif s == "pool":
            opts = [o.name for o in registry.layers.options("MaxPool2D")]
            s = {"type": "MaxPool2D", _pick(opts, ("pool_size", "size", "kernel_size", "pool"), "pool size"): 2}
        out.append(s)
    return out


def missing_layers(w: Workload) -> list[str]:
    from dlrun import registry

    return [n for n in w.needs if n not in registry.layers]


def gemm_flops(model, samples: int) -> float:
    """Analytic GEMM FLOPs of training on ``samples`` samples: forward, dW, and dX except layer 0."""
    total = 0.0
    for i, (layer, out_shape) in enumerate(zip(model.layers, model.shapes)):
        w = layer.params.get("weight")
        name = type(layer).__name__
        if w is not None and name == "Linear":
            per = 2.0 * w.size
        elif w is not None and name == "Conv2D":
            per = 2.0 * w.size * int(np.prod(out_shape[1:]))
        else:
            per = 0.0
        total += per * (3 if i > 0 else 2)
    return total * samples
