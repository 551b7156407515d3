"""Assembling a run: the one place that turns a validated config into what a run needs.

:func:`assemble` computes, once and in this order, every part of a run and checks it before any
file is written: the run seed (:mod:`dlrun.seeding`), the data and its validation split, the
model on its device, the loss, the trainer with its optimizer, regularizer, metrics and its
training step, the monitored metric (:mod:`dlrun.metrics.monitor`) and the training controls (clipping,
schedule, early stopping). ``dlrun train``, ``--resume``, ``check`` and ``time`` run what it
returns; ``evaluate``, ``predict`` and ``gradcheck CONFIG`` build their model with
:func:`build_model`, and need no optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..metrics import monitor
from ..training import capture, controls
from .. import metrics, parallel
from ..backend import get_backend
from ..config import Config
from ..errors import ConfigError
from ..data import Dataset, check_range, load_data
from ..data.preprocess import Preprocessing
from ..model import Sequential
from ..model.graph import Graph
from ..training.preflight import (balance_class_weights,
                                  check_batch_memory,
                                  check_class_weights,
                                  check_labels,
                                  check_model_indices,
                                  scale_warning)
from ..training.trainer import Trainer


@dataclass
class Assembly:
    """The parts of a run, built from its config by :func:`assemble`."""

    config: Config
    data: Dataset
    trainer: Trainer
    controls: list      # clipping, schedule, early stopping (the ``train:`` controls), in that order
    monitor: monitor.Monitor  # what best.npz follows (and early stopping, when it names no other)
    warnings: list[str] = field(default_factory=list)  # data that trains badly (preflight.scale_warning)

    @property
    def model(self) -> Sequential:
        return self.trainer.model

    @property
    def has_validation(self) -> bool:
        return self.data.x_val is not None and len(self.data.x_val) > 0


def resolve_seed(config: Config) -> int:
    """The config's seed, or a fresh one (:func:`seeding.fresh_seed`, the same on every rank of a
    data-parallel run) recorded into ``config.raw``."""
    if config.seed is None:  # (the ranks of a data-parallel run take rank 0's)
        config.seed = parallel.current().fresh_seed()
    config.raw["seed"] = config.seed
    return config.seed


def build_model(config: Config, input_shape, backend=None, dtype=None, seed: int | None = None,
                frozen: bool = True, world=None) -> Sequential:
    """The config's layers, built for ``input_shape`` on the config's device (or ``backend``), in
    the config's dtype (or ``dtype``), with its initial weights drawn from the run seed (or
    ``seed``); ``frozen=False`` leaves every parameter trainable (``trainable: false`` ignored).
    ``world``: the ranks of a data-parallel run (:mod:`dlrun.parallel`) that will train it."""
    backend = backend or get_backend(config.device)
    dtype = dtype or config.dtype
    seed = config.seed if seed is None else seed
    if config.nodes is not None:  # Residual, Parallel or named inputs: a graph of nodes
        return Graph(config.build_layers(), [n.node for n in config.nodes], input_shape, backend, dtype, seed,
                     config.locate, frozen=config.frozen if frozen else (), loose=config.frozen_loose, world=world)
    return Sequential(config.build_layers(), input_shape, backend, dtype, seed, config.locate,
                      frozen=config.frozen if frozen else (), world=world)


def check_parts(trainer: Trainer, n: int, world, config: Config) -> None:
    """A ConfigError when a batch of the epoch holds fewer samples than a data-parallel run has
    ranks: each rank trains on its own part of every batch, and a part must not be empty."""
    if world.size == 1:
        return
    bs, batches = trainer.epoch_batches(n)
    smallest = min(n, batches * bs) - (batches - 1) * bs
    if smallest >= world.size:
        return
    what = "each batch" if smallest == bs else f"the last batch of each epoch ({n} samples in batches of {bs})"
    raise ConfigError(f"{what} holds {smallest} sample{'s' if smallest != 1 else ''}, fewer than the {world.size} "
                      f"ranks, and every rank trains on its own part of each batch; raise train.batch_size"
                      + ("" if smallest == bs else " or set train.drop_last: true"),
                      config.locate("train.batch_size"))


def check_cuda_graph(trainer: Trainer, config: Config) -> None:
    """A ConfigError when ``train.cuda_graph: true`` asks for a CUDA graph that the step cannot
    have, saying why."""
    if config.train.cuda_graph is not True:
        return
    why = capture.blocker(trainer.training_step, trainer.controls)
    if why is not None:
        raise ConfigError(f"true, but the training step cannot be captured in a CUDA graph: {why}; set "
                          f"train.cuda_graph to auto (capture where possible) or false", config.locate("train.cuda_graph"))


def assemble(config: Config, fitted: Preprocessing | None = None) -> Assembly:
    """Every part of a run, built and checked before any file is written (see the module docstring).
    ``fitted``: the preprocessing a resumed run recorded (else it is fitted on the training split)."""
    resolve_seed(config)
    backend = get_backend(config.device)
    world = parallel.current()
    if world.size > 1 and backend.name == "gpu":  # each rank on the GPU of its local rank, before it allocates
        world.use_gpu(backend)
    ds = load_data(config, fitted)
    check_range(ds, config.dtype)
    model = build_model(config, ds.input_shape, backend, world=world)
    check_model_indices(ds, model)
    loss = config.build("loss")
    check_class_weights(loss, model, config.locate("loss.class_weights"))
    check_labels(ds, model, loss, config.locate)
    balance_class_weights(loss, model, ds.y, config)  # (the training split's labels)
    outputs = model.output_shape[-1] if model.output_shape else 1
    trainer = Trainer(model, loss, config.build("optimizer"), config.build("regularizer"),
                      config.train.batch_size, config.train.shuffle, config.seed, config.train.drop_last,
                      config.train.accumulate_batches,
                      metrics.build(config.train.metrics, loss, outputs, config.locate), config.train.cuda_graph)
    check_batch_memory(model, trainer.epoch_batches(len(ds.x))[0], config.locate("train.batch_size"))
    check_parts(trainer, len(ds.x), world, config)
    has_val = ds.x_val is not None and len(ds.x_val) > 0
    trainer.controls = controls.from_config(config, has_val, trainer.classification, trainer.tracker.modes)
    check_cuda_graph(trainer, config)
    watched = monitor.of_run(config, has_val, trainer.classification, trainer.tracker.modes)
    trainer.monitor = watched
    warned = scale_warning(ds)
    return Assembly(config, ds, trainer, trainer.controls, watched, [warned] if warned else [])

