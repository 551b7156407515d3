"""Where inside an epoch a training run stopped, so that a resume can continue from that batch.

An interrupted run (Ctrl-C, SIGTERM) saves the state after its last finished *batch*, not its
last finished epoch. The checkpoint's ``epoch`` then counts the finished epochs, its weights,
optimizer, layer state and layer generators are those after ``batches_done`` batches of the
next one, and its ``position`` record says how to continue that epoch exactly: the shuffling
generator's state before it drew the epoch's order (drawn again on resume, the same order), the
loss and correct predictions summed over the batches done, and the seconds spent on them.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np

from .. import seeding
from ..data.pieces import row_blocks
from ..errors import CheckpointError, ConfigError


@dataclass(frozen=True)
class EpochPosition:
    """A point between two batches of ``epoch``; see the module docstring.

    Args:
        epoch: the epoch that is under way (1-based; the epochs before it are finished).
        batches_done: its batches already trained on (at least 1, fewer than ``batches``).
        batches: its batches in all.
        samples: training samples per epoch, and batch_size the samples per batch, when it stopped.
        shuffle: the shuffling generator's state before the epoch's order was drawn (None: no shuffling).
        loss_sum: Σ batch loss × batch size over the batches done (float64).
        correct: correct predictions over the batches done (0 for regression).
        seconds: wall-clock seconds spent on the batches done.
        metrics: the metrics of train.metrics with every option ('top_k_accuracy(k=5)'), and
            metric_sums their sums over the batches done (:class:`dlrun.metrics.Tracker`).
        rank_sums: in a data-parallel run, each rank's share of those sums, in rank order:
            ``[loss_sum, correct, *metric_sums]`` (a resume on as many ranks continues each).
    """

    epoch: int
    batches_done: int
    batches: int
    samples: int
    batch_size: int
    shuffle: dict | None
    loss_sum: float
    correct: int
    seconds: float
    metrics: tuple = ()
    metric_sums: tuple = ()
    rank_sums: tuple = ()

    def to_meta(self) -> dict:
        meta = asdict(self)
        if not self.rank_sums:  # (one process)
            del meta["rank_sums"]
        return meta

    def __str__(self) -> str:
        return f"batch {self.batches_done} of {self.batches} of epoch {self.epoch}"

    @classmethod
    def from_meta(cls, meta: dict | None, where: str) -> "EpochPosition | None":
        if meta is None:
            return None
        try:
            return cls(**meta)
        except TypeError:
            raise CheckpointError(f"{where}: the checkpoint's position record is damaged ({sorted(meta)}); "
                                  f"it cannot be resumed") from None

    def check(self, samples: int, batch_size: int, batches: int, shuffle: bool, where: str,
              metrics: tuple = ()) -> None:
        """Raise a CheckpointError unless a run with these settings (and train.metrics' names)
        continues this epoch exactly."""
        was = (self.samples, self.batch_size, self.batches, self.shuffle is not None)
        now = (samples, batch_size, batches, shuffle)
        if was == now and tuple(self.metrics) != tuple(metrics):
            names = [", ".join(m) or "none" for m in (self.metrics, metrics)]
            raise CheckpointError(f"{where}: the run stopped after {self} with train.metrics {names[0]}; the resumed "
                                  f"config records {names[1]}, whose sums over the batches done are not known. "
                                  f"Finish epoch {self.epoch} with the run's metrics "
                                  f"(--set train.epochs={self.epoch}), then resume with the new ones")
        if was == now:
            return
        def say(s, bs, b, sh):
            return f"{s} training samples in {b} batches of {bs}, {'shuffled' if sh else 'in order'}"
        raise CheckpointError(f"{where}: the run stopped after batch {self.batches_done} of {self.batches} of epoch "
                              f"{self.epoch} ({say(*was)}); the resumed config gives {say(*now)}, so that epoch "
                              f"cannot be continued. Resume with the run's data, train.batch_size, "
                              f"train.drop_last and train.shuffle; to change them, first finish epoch {self.epoch} "
                              f"with them (--set train.epochs={self.epoch}), then resume with the new ones")


def data_digest(x, y) -> str:
    """A digest of the training samples and labels (host arrays, in order): a resume inside an
    epoch must see the same data, or its remaining batches would not be the epoch's."""
    h = hashlib.blake2b(digest_size=16)
    for a in (x, y):
        h.update(f"{a.shape}{a.dtype.str}".encode())
        for _, block in row_blocks(a):  # (the digest of the whole array's bytes, read a piece at a time)
            h.update(memoryview(np.ascontiguousarray(block)).cast("B"))
    return h.hexdigest()


def check_data(recorded: str | None, now: str, position: EpochPosition, where: str) -> None:
    """Raise a CheckpointError when the run stopped inside an epoch on other training data than
    the resumed config gives (same sizes, other values: a changed data seed, noise or file)."""
    if recorded is not None and recorded != now:
        raise CheckpointError(f"{where}: the run stopped after {position}, but the resumed config gives other "
                              f"training data (same size, other values), so that epoch cannot be continued. "
                              f"Resume with the run's data settings; to change them, first finish epoch "
                              f"{position.epoch} with them (--set train.epochs={position.epoch})")


def check_split(recorded: dict | None, config) -> None:
    """Raise a ConfigError when a resumed config holds out other validation samples than the run
    did (train.validation_split, train.split_seed or the run seed that stands in for it): the
    epochs to come would train on samples the earlier ones validated on."""
    if not isinstance(recorded, dict):
        return
    before = recorded.get("train") if isinstance(recorded.get("train"), dict) else {}
    fraction = float(before.get("validation_split") or 0.0)
    seed = before.get("split_seed") if before.get("split_seed") is not None else recorded.get("seed")
    now = seeding.split_seed(config.seed, config.train.split_seed)
    if fraction == config.train.validation_split and (fraction == 0 or seed is None or seed == now):
        return
    if fraction != config.train.validation_split:
        key = path = "train.validation_split"
        old, new = fraction, config.train.validation_split
    elif config.train.split_seed is None and before.get("split_seed") is None:  # the run seed stands in for it
        key, path, old, new = "the run seed (train.split_seed unset)", "seed", seed, now
    else:
        key, path, old, new = "train.split_seed", "train.split_seed", seed, now
    raise ConfigError(f"the run held out its validation samples with {key} {old}, this resume with {new}: the "
                      f"epochs to come would train on samples the earlier ones validated on. A resumed run keeps "
                      f"its split; to change it, start a new run from scratch (weights trained on the old split "
                      f"have seen the new validation samples)", config.locate(path))


def check_resume(trainer, x, y, recorded_digest: str | None, where: str) -> None:
    """For a checkpoint taken inside an epoch (``trainer.position``), raise a CheckpointError unless
    the resumed config gives that epoch's batches: the same sizes, shuffling and data."""
    p = trainer.position
    if p is not None:
        p.check(len(x), *trainer.epoch_batches(len(x)), trainer.shuffle, where, trainer.tracker.described)
        check_data(recorded_digest, data_digest(x, y), p, where)


def describe(meta: dict) -> str:
    """When a checkpoint was taken, from its metadata: 'epoch 3' or 'batch 2 of 7 of epoch 4'."""
    position = meta.get("position")
    if position:
        return f"batch {position.get('batches_done')} of {position.get('batches')} of epoch {position.get('epoch')}"
    return f"epoch {meta.get('epoch')}"
