"""What a config may say: the top-level keys and the ``train:`` section, as typed fields with
defaults and docs. :mod:`dlrun.config` checks configs against them, :mod:`dlrun.config.resolved`
fills in their defaults and :mod:`dlrun.config.schema` turns them into a JSON Schema."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from ..data.preprocess import Settings as Preprocess
from ..registry.options import FilePath, Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt


@dataclass(frozen=True)
class Components:
    """Marks a value that names components of one registry kind (``kind``: a key of
    ``dlrun.registry.REGISTRIES``), one spec or, with ``many``, a list of them; dlrun.config
    checks it against that registry."""

    kind: str
    many: bool = False
    # keys a spec may carry besides its component's options, each a settings section (data's preprocess)
    sections: tuple[tuple[str, type], ...] = ()


@dataclass(frozen=True)
class Key:
    """A top-level key of a config: its type, its default and what it is for."""

    hint: Any
    default: Any
    doc: str
    required: bool = False




@dataclass
class EarlyStoppingSettings:
    """The ``train.early_stopping:`` section: stop when ``monitor`` stops improving.

    Args:
        monitor: the metric to watch: val_loss, val_accuracy, train_loss, train_accuracy, or
            train_NAME / val_NAME for a metric NAME of train.metrics (val_mae, val_f1).
        patience: epochs without improvement after which training stops.
        min_delta: the smallest change that counts as an improvement.
        mode: min (losses), max (accuracies) or auto (the metric's own: max for accuracies, F1
            and R², min for losses and errors).
        restore_best_weights: when training ends, put back the weights of the best epoch
            (default: keep the last epoch's weights).
    """

    monitor: str = "val_loss"  # checked against the metrics the run records (dlrun.metrics.monitor.check)
    patience: NonNegativeInt = 5
    min_delta: NonNegativeFloat = 0.0
    mode: Literal["auto", "min", "max"] = "auto"
    restore_best_weights: bool = False


@dataclass
class TrainSettings:
    """The ``train:`` section.

    Args:
        epochs: passes over the training data.
        batch_size: samples per step; null means the whole training set (full batch).
        shuffle: reshuffle the training data every epoch (seeded by the run seed).
        drop_last: skip each epoch's last batch when it is smaller than batch_size (PyTorch's
            DataLoader option; with shuffling, different samples are left out each epoch).
        accumulate_batches: step the optimizer once every N batches, on the gradient of the mean
            loss over their samples (Lightning's accumulate_grad_batches): a batch N times larger
            in the memory of one.
        validation_split: fraction of the data held out for validation (stratified for labels).
        split_seed: seed of the validation split; null uses the run seed, so another --seed also
            draws another validation set. Fix it to compare seeds on the same validation samples.
        clip_norm: rescale all gradients together when their global L2 norm exceeds this.
        clip_value: clip every gradient entry to [-clip_value, clip_value].
        schedule: learning-rate schedule, e.g. {type: cosine} (see `dlrun list schedules`).
        schedule_interval: epoch (the schedule sets the rate once per epoch) or step (before
            every step, as Keras' LearningRateSchedule and Lightning's interval: step).
        early_stopping: stop when a metric stops improving (see EarlyStoppingSettings).
        checkpoint_every: write checkpoints/last.npz (and best.npz) every N epochs, and at the end.
        metrics: more metrics to record each epoch for the training and the validation data, as
            train_NAME and val_NAME (Keras' metrics), e.g. [mae] or [f1, {type: top_k_accuracy, k: 3}];
            see `dlrun list metrics`. Loss and accuracy are always recorded.
        monitor: metric that picks checkpoints/best.npz (lowest loss, highest accuracy); null means
            early_stopping's monitor when it is set, else val_loss with a validation split, else
            train_loss.
        loggers: where each epoch's metrics are written: csv (the run's metrics.csv, which
            every run writes, since --resume, dlrun plot and dlrun runs read it) and tensorboard
            (TensorBoard event files in the run directory, with the hyper-parameters; needs the
            tensorboard extra), e.g. [csv, tensorboard].
        log_every_n_steps: also write the training loss of every Nth optimizer step to TensorBoard
            (step_loss; Lightning's log_every_n_steps); null writes per epoch only.
        cuda_graph: on the GPU, record the training step once in a CUDA graph and replay it for
            every batch of the full batch size, which saves the launch cost of each kernel (see
            docs/performance.md). auto: where the step can be captured; true: the same, but
            refuse to train when it cannot; false: never. Results are the same either way.
    """

    epochs: PositiveInt = 10
    batch_size: PositiveInt | None = 32
    shuffle: bool = True
    drop_last: bool = False
    accumulate_batches: PositiveInt = 1
    validation_split: Fraction = 0.0
    split_seed: NonNegativeInt | None = None
    clip_norm: PositiveFloat | None = None
    clip_value: PositiveFloat | None = None
    schedule: Annotated[Any, Components("schedules")] = None  # checked against registry.schedules in validate()
    schedule_interval: Literal["epoch", "step"] = "epoch"
    early_stopping: EarlyStoppingSettings | None = None
    checkpoint_every: PositiveInt = 1
    metrics: Annotated[Any, Components("metrics", many=True)] = None  # checked in validate()
    monitor: str | None = None
    loggers: list[Literal["csv", "tensorboard"]] = ("csv",)  # (a tuple: a default is never shared)
    log_every_n_steps: PositiveInt | None = None
    cuda_graph: Literal["auto"] | bool = "auto"


# the top-level keys, in the order a resolved config lists them
TOP_LEVEL = {
    "name": Key(str, None, "run name used for the run directory (default: the config file's name)"),
    "seed": Key(NonNegativeInt | None, None, "integer seed for weights, shuffling and layer randomness "
                                            "(default: drawn and recorded)"),
    "device": Key(Literal["cpu", "gpu"], "cpu", "cpu or gpu"),
    "dtype": Key(Literal["float32", "float64"], "float32", "float32 (default) or float64"),
    "plugins": Key(list[FilePath], [], "Python files with user layers, relative to this file"),
    "data": Key(Annotated[Any, Components("data", sections=(("preprocess", Preprocess),))], None,
                "data generator or file", True),
    "model": Key(Annotated[Any, Components("layers", many=True)], None, "list of layers", True),
    "loss": Key(Annotated[Any, Components("losses")], None, "loss function", True),
    "optimizer": Key(Annotated[Any, Components("optimizers")], None, "optimizer", True),
    "regularizer": Key(Annotated[Any, Components("regularizers")], None, "run-wide default regularizer for weights"),
    "train": Key(TrainSettings | None, None, "training settings"),
}
