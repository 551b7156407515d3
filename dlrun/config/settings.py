"""The ``train:`` section's schema: typed fields with defaults, checked by :mod:`dlrun.config`
(which owns reading and validating configs) and documented by their docstrings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..registry.options import Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt


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
    schedule: Any = None  # a schedule spec, checked against registry.schedules in validate()
    schedule_interval: Literal["epoch", "step"] = "epoch"
    early_stopping: EarlyStoppingSettings | None = None
    checkpoint_every: PositiveInt = 1
    metrics: Any = None  # a list of metric specs, checked against registry.metrics in validate()
    monitor: str | None = None
