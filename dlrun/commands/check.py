"""`dlrun check`: validate a config end to end on one batch, without training or writing files.

The config is validated, the data loaded and split, the model built, one batch drawn and run
forward, through the loss and backward, layer by layer. Each layer's output and gradients are
checked for the shape its ``build`` promised and for NaN/inf, and its memory is measured. Then
the same step continues as the trainer's first does, checking the loss, regularizers, schedule
and optimizer (:class:`dlrun.training.step.FirstStep`): one observed training step does it all.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runs import checkpoint
from ..runs.assembly import assemble
from ..config import Config
from ..errors import LayerContractError, Location, NonFiniteError
from ..training.faults import nonfinite_kind
from ..training.preflight import chance_warning
from ..training.step import StepObserver


@dataclass(frozen=True)
class LayerReport:
    """One layer on the checked batch; memory in bytes.

    ``activation_bytes`` counts the layer's output plus the arrays it cached for backward
    (inputs, masks), each array once across the model.
    """

    index: int
    name: str
    output_shape: tuple[int, ...]
    params: int
    param_bytes: int
    grad_bytes: int
    activation_bytes: int
    fixed: int = 0  # parameters that training does not change (constants, frozen layers)
    node: str = ""        # a graph's node: its name or its place in the config
    inputs: tuple = ()    # a graph's node: the nodes it reads

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.activation_bytes


@dataclass(frozen=True)
class CheckReport:
    """What `dlrun check` found."""

    data: str
    train_samples: int
    val_samples: int
    input_shape: tuple[int, ...]
    batch_size: int
    layers: list[LayerReport]
    loss: float
    device: str
    dtype: str
    checkpoint: str | None = None
    preprocess: str | None = None  # what data.preprocess learned from the training split, in one line
    warnings: tuple[str, ...] = ()  # data that trains badly (features of very different scales, a loss far above chance)

    @property
    def total_bytes(self) -> int:
        return sum(r.total_bytes for r in self.layers)


def _arrays(obj) -> list:
    """Arrays an object holds as attributes (numpy or cupy), directly or in a list or tuple
    (MaxPool2D's sub-grids), for the memory count."""
    found = []
    for v in vars(obj).values():
        for a in (v if isinstance(v, (list, tuple)) else (v,)):
            if hasattr(a, "nbytes") and hasattr(a, "shape"):
                found.append(a)
    return found


def _owner(a):
    """The array whose memory ``a`` views (``a`` itself when it owns its data)."""
    while hasattr(getattr(a, "base", None), "nbytes"):
        a = a.base
    return a


class FirstBatch(StepObserver):
    """`dlrun check`'s observer of the first training step: every layer call runs with its
    contract checks, every output and gradient is checked for NaN/inf, and each layer's memory
    (its output and what it cached for backward) is counted, once per owning array."""

    checks_layers = True

    def __init__(self, model, loss):
        self.model, self.loss_fn = model, loss
        # memory is counted once per owning array (views share it); the owners stay referenced in
        # `held`, so that no id is reused by a later array while counting
        self.held = [_owner(a) for _, p in model.named_parameters() for a in (p.data, p.grad) if a is not None]
        self.counted: set[int] = {id(a) for a in self.held}
        self.activations = [0] * len(model.layers)
        self.value = None

    def forward(self, k, layer, out):
        i = self.model.order[k]
        if (kind := nonfinite_kind(out)) is not None:
            raise NonFiniteError(f"{self.model.label(i)} {layer!r} produced {kind} in forward on the first batch",
                                 1, 1, self.model.label(i))
        mem = 0
        for a in map(_owner, [out, *_arrays(layer)]):
            if id(a) not in self.counted:
                self.counted.add(id(a))
                self.held.append(a)
                mem += int(a.nbytes)
        self.activations[i] = mem

    def loss(self, value, out, y):
        self.value = value
        if (kind := nonfinite_kind(value)) is not None:
            raise NonFiniteError(f"the loss {self.loss_fn!r} is {kind} on the first batch", 1, 1, "loss")

    def backward(self, k, layer, dx):
        i = self.model.order[k]
        for pname, p in layer.params.items():
            if p.trainable and (kind := nonfinite_kind(p.grad)) is not None:
                raise NonFiniteError(f"{self.model.label(i)} {layer!r} produced {kind} in backward (the gradient "
                                     f"of {pname}) on the first batch", 1, 1, self.model.label(i))
        for m, d in enumerate(dx if isinstance(dx, (tuple, list)) else (dx,)):
            if d is not None and (kind := nonfinite_kind(d)) is not None:
                what = "dx" if not isinstance(dx, (tuple, list)) else f"the gradient of input {m}"
                raise NonFiniteError(f"{self.model.label(i)} {layer!r} produced {kind} in backward ({what}) on the "
                                     f"first batch", 1, 1, self.model.label(i))


def check_config(config: Config, checkpoint_path: str | Path | None = None) -> CheckReport:
    """Build everything a run needs and run its first training step on one batch, observed
    (:class:`FirstBatch`); raise the first problem."""
    run = assemble(config)
    ds, trainer = run.data, run.trainer
    model, loss, b = trainer.model, trainer.loss, trainer.backend
    ckpt = None
    if checkpoint_path is not None:
        checkpoint_path = checkpoint.resolve(checkpoint_path)  # a run directory too, as predict takes
        arrays, _, meta = checkpoint.load(checkpoint_path)
        if isinstance(meta.get("input_shape"), list):
            ds.check_input_shape(tuple(meta["input_shape"]), f"the model in {checkpoint_path}")
        model.load_state_arrays(arrays, checkpoint_path, meta)
        ckpt = str(checkpoint_path)
    n = len(ds.x)
    bs = min(config.train.batch_size or n, n)
    xb, yb = trainer.to_device(ds.x[:bs], ds.y[:bs])
    first = FirstBatch(model, loss)
    # the step runs as the trainer's first: the loss's returns, the regularizers, the schedule's
    # first rate, the optimizer's step and train.metrics are checked as training checks them
    controls = run.controls
    try:
        with np.errstate(all="ignore"):
            for c in controls:
                c.on_train_begin(trainer)
                c.on_epoch_begin(1, trainer.epoch_batches(n)[1])
            sums = trainer.tracker.zeros()
            trainer.training_step.observed(xb, yb, controls, sums=sums, observers=[first])
            trainer.tracker.results(sums, "train_")
    except LayerContractError as e:  # located at the config line of the layer (the message names it)
        i = getattr(e, "layer_index", None)
        if e.where is None and i is not None:
            at = config.locate(model.label(i))
            e.where = Location(at.source, at.line) if at is not None else None
        raise
    rows = []
    owned = {i for i, _ in model.owners()}  # (a node that shares another's weights holds none)
    for i, (layer, act, row) in enumerate(zip(model.layers, first.activations, model.summary())):
        ps = list(layer.params.values()) if i in owned else []
        rows.append(LayerReport(i, row.name, model.shapes[i], sum(p.size for p in ps),
                                sum(int(p.data.nbytes) for p in ps),
                                sum(int(p.grad.nbytes) for p in ps if p.grad is not None), act,
                                sum(p.size for p in ps if not p.trainable), row.node, row.inputs))
    notes = [*run.warnings, chance_warning(float(first.value), model, loss)]
    return CheckReport(ds.name, n, 0 if ds.x_val is None else len(ds.x_val), model.input_shape, bs, rows,
                       float(first.value), b.name, str(model.dtype), ckpt,
                       ds.preprocess.describe() if ds.preprocess is not None else None, tuple(filter(None, notes)))
