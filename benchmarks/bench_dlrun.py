"""dlrun's side of a workload: registry-built layers, Sequential, Trainer.fit (the real machinery)."""
from __future__ import annotations

import time

import numpy as np

from workloads import Workload, gemm_flops, resolve_layers


def build(w: Workload, device: str = "cpu", world=None):
    """(trainer, x, y, epochs, cfg): a shipped config through dlrun.runs.assembly.assemble, else from the specs
    (``world``: a data-parallel run's ranks, dlrun.parallel.join(); assemble takes the joined one itself)."""
    from dlrun import registry
    from dlrun.backend import get_backend
    from dlrun.model import Sequential
    from dlrun.training.trainer import Trainer

    if w.config:
        from dlrun.config import load_config
        from dlrun.runs.assembly import assemble

        cfg = load_config(w.config, list(w.overrides) + [f"device={device}"])
        run = assemble(cfg)
        ds, trainer = run.data, run.trainer
        trainer.shuffle = False  # same batch order as the torch side
        return trainer, ds.x.astype(np.float32), ds.y, cfg.train.epochs, cfg
    x, y = w.data()
    layers = [registry.layers.build(s) for s in resolve_layers(w.layers)]
    model = Sequential(layers, w.input_shape, get_backend(device), np.float32, seed=w.seed, world=world)
    opt = registry.optimizers.build({"type": "SGD", "learning_rate": w.learning_rate, "momentum": w.momentum})
    loss = registry.losses.build("SoftmaxCrossEntropy")
    trainer = Trainer(model, loss, opt, None, w.batch_size, shuffle=False, seed=w.seed)
    return trainer, x, y, w.epochs, None


def prepare(w: Workload, device: str = "cpu"):
    """Return ``run() -> (wall seconds, CPU seconds, final_loss)`` and the workload's GEMM FLOPs.

    On GPU the data is moved to the device once, before timing (as the torch side does)."""
    trainer, x, y, epochs, _ = build(w, device)
    model, opt, backend = trainer.model, trainer.optimizer, trainer.backend
    init = {k: v.copy() for k, v in model.state_arrays().items()}
    opt0 = {k: np.zeros_like(v) if k != "iterations" else v for k, v in opt.state_dict().items()}
    x, y = trainer.to_device(x, y)

    def run():
        model.load_state_arrays(init)
        opt.load_state_dict(opt0)
        trainer.epoch = trainer.step = 0
        backend.synchronize()
        if device == "gpu":  # the pool keeps the blocks that loading the initial state used: release
            import cupy  # them, so that its size after the runs is what training itself held

            cupy.get_default_memory_pool().free_all_blocks()
        t0, c0 = time.perf_counter(), time.process_time()
        hist = trainer.fit(x, y, epochs=epochs)
        backend.synchronize()
        return time.perf_counter() - t0, time.process_time() - c0, hist.last["train_loss"]

    return run, gemm_flops(model, len(x) * epochs)
