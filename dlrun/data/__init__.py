"""Datasets, the spiral generator and the checks every data source passes (the ``file`` loader
is :mod:`dlrun.data.files`; more generators are in :mod:`dlrun.data.generators` and
:mod:`dlrun.data.datasets`), registered under ``data:`` in a config.

Each returns a :class:`Dataset` of host numpy arrays: features ``x`` (N, ...) and targets ``y``
(integer labels for classification, floats for regression). A generator may also provide its
own validation part; otherwise the trainer splits off ``train.validation_split`` with the run seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import seeding
from ..errors import ConfigError, ContractError, DataError
from .preprocess import Preprocessing, Settings, fit
from .table import Table, encode_labels
from ..registry.options import NonNegativeFloat, NonNegativeInt, PositiveInt
from ..registry import data
from .mapped import Rows
from .pieces import SCAN_BYTES, first_row


@dataclass
class Dataset:
    """Host arrays for training (and optionally validation)."""

    x: np.ndarray
    y: np.ndarray
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    name: str = "data"
    rows: np.ndarray | None = None  # for a CSV file: the file line of each sample in x
    rows_val: np.ndarray | None = None  # ... and of each sample in x_val
    name_val: str | None = None  # the file of x_val when it is not ``name`` (file's validation_path)
    samples: np.ndarray | None = None  # after a split: each sample's 0-based place in the data as read
    samples_val: np.ndarray | None = None  # ... and each validation sample's
    columns: list[str] | None = None  # the feature columns' names (a CSV with a header)
    target: str | None = None  # the label column's name
    classes: list[str] | None = None  # class names: label k is classes[k]
    preprocess: Preprocessing | None = None  # fitted on the training split by load_data, applied to x and x_val
    owned: bool = False  # x is the loader's own array (read from a file): the split may reorder it in place

    def __post_init__(self):  # a (plugin's) data generator that pairs samples and labels wrongly
        for x, y, part in ((self.x, self.y, ""), (self.x_val, self.y_val, "validation ")):
            if (x is None) != (y is None) or (x is not None and len(x) != len(y)):
                raise DataError(f"data {self.name!r}: {0 if x is None else len(x)} {part}samples but "
                                f"{0 if y is None else len(y)} labels; each sample needs one label (or target row)")

    def where(self, i: int, val: bool = False) -> str:
        """'file:line' for a CSV, else 'NAME: sample i' (1-based, its place in the data as read when
        a split reordered it) for sample ``i`` of x (or x_val)."""
        rows = self.rows_val if val else self.rows
        if rows is not None:
            return f"{(self.name_val or self.name) if val else self.name}:{int(rows[i])}"
        samples = self.samples_val if val else self.samples
        if samples is not None:
            return f"{self.name}: sample {int(samples[i]) + 1}"
        return f"{self.name}: {'validation ' if val else ''}sample {i + 1}"

    def check_input_shape(self, expected: tuple[int, ...], model: str = "the model") -> None:
        """Raise DataError when samples do not have the per-sample shape a model takes."""
        for part, val in ((self.x, False), (self.x_val, True)):
            if part is not None and tuple(part.shape[1:]) != tuple(expected):
                got = part.shape[1:]
                what = f"{got[0]} features" if len(got) == 1 else f"shape {tuple(got)}"
                want = f"{expected[0]} features" if len(expected) == 1 else f"shape {tuple(expected)}"
                raise DataError(f"{self.where(0, val)}: each sample has {what}, but {model} takes {want}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def num_classes(self) -> int | None:
        if self.y.dtype.kind not in "iu":
            return None
        if self.classes is not None:
            return len(self.classes)
        ys = [self.y] + ([self.y_val] if self.y_val is not None else [])
        return int(max(int(a.max()) for a in ys if a.size)) + 1


def split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int, stratify: bool = True, shares: str = "whole"):
    """Seeded train/validation split of round(n·fraction) samples; stratified by class for
    integer labels (each class's share by largest remainder, see :func:`_class_shares`).
    ``shares="per_class"`` gives each class round(count·fraction) instead: the split of runs
    recorded by dlrun before the largest-remainder split (their checkpoints say no ``split_shares``),
    so that resuming or evaluating one holds out the samples it held out.

    Returns ``(x_train, y_train, x_val, y_val)``; raises DataError when either part is empty.
    """
    n = len(x)
    if fraction <= 0:
        return x, y, None, None
    rng = seeding.split_stream(seed)
    stratified = stratify and y.dtype.kind in "iu" and y.ndim == 1
    if stratified:
        members = []
        for c in np.unique(y):
            idx = np.flatnonzero(y == c)
            rng.shuffle(idx)
            members.append(idx)
        counts = np.array([len(m) for m in members])
        take = (_class_shares(counts, int(round(n * fraction)), rng) if shares == "whole"
                else [int(round(c * fraction)) for c in counts])
        val = np.sort(np.concatenate([m[:k] for m, k in zip(members, take)]))
    else:
        perm = rng.permutation(n)
        val = np.sort(perm[: int(round(n * fraction))])
    mask = np.zeros(n, dtype=bool)
    mask[val] = True
    if mask.all() or not mask.any():
        part = "training" if mask.all() else "validation"
        raise DataError(
            f"validation_split={fraction} of {n} samples leaves no {part} data"
            + (" (the split is stratified, and no class gives up its last training sample)"
               if stratified and round(n * fraction) > 0 else f"; choose a fraction between {1 / n:.3g} and {1 - 1 / n:.3g}")
        )
    return x[~mask], y[~mask], x[mask], y[mask]


def _class_shares(counts: np.ndarray, n_val: int, rng) -> np.ndarray:
    """How many samples of each class go to validation: n_val in all, shared in proportion to
    the class counts by largest remainder (each class's share rounded down, then one more for
    the classes with the largest fractions, ties in seeded random order), as scikit-learn's
    stratified split does; no class gives up its last training sample. What classes kept at
    their last sample cannot give, the others give, one each in the same order, round after
    round. Draws from ``rng`` only when shares must be rounded."""
    quota = counts * n_val / counts.sum()
    room = np.maximum(counts - 1, 0)
    take = np.minimum(np.floor(quota).astype(np.int64), room)
    short = n_val - int(take.sum())
    if short > 0:
        order = np.lexsort((rng.permutation(len(counts)), take - quota))  # largest fraction first
        while short > 0 and (take < room).any():
            for c in order:
                if short and take[c] < room[c]:
                    take[c] += 1
                    short -= 1
    return take


@data.register("spiral")
def spiral(classes: PositiveInt = 3, points_per_class: PositiveInt = 100,
           noise: NonNegativeFloat = 0.2, seed: NonNegativeInt = 0) -> Dataset:
    """Interleaved 2-D spirals (the cs231n case study), one arm per class.

    For class j: r = linspace(0, 1, n), t = linspace(4j, 4(j+1), n) + noise·N(0, 1),
    point = (r·sin t, r·cos t).

    Args:
        classes: number of classes (spiral arms).
        points_per_class: points in each arm.
        noise: standard deviation of the angle noise.
        seed: seed of the noise.
    """
    rng = seeding.data_stream(seed)
    n = points_per_class
    r = np.tile(np.linspace(0.0, 1.0, n), classes)
    base = np.linspace(0.0, 4.0, n)
    t = (base[None, :] + 4.0 * np.arange(classes)[:, None]).ravel() + noise * rng.standard_normal(n * classes)
    x = np.stack([r * np.sin(t), r * np.cos(t)], axis=1)
    y = np.repeat(np.arange(classes, dtype=np.int64), n)
    return Dataset(x, y, name="spiral")


def check_range(ds: Dataset, dtype) -> None:
    """Features finite in float64 but beyond ``dtype``'s range would become inf in the first batch."""
    limit = float(np.finfo(dtype).max)
    if limit >= np.finfo(np.float64).max:
        return
    for x, val in ((ds.x, False), (ds.x_val, True)):
        if x is None or not len(x) or x.dtype.kind != "f":
            continue
        i = first_row(x, lambda b: (np.abs(b) > limit).any(axis=1))
        if i is not None:
            row = np.asarray(x[i]).ravel()
            v = float(row[np.argmax(np.abs(row))])
            raise DataError(f"{ds.where(i, val)}: feature value {v:g} is beyond the range of {np.dtype(dtype)} "
                            f"(±{limit:.4g}), where it would become inf; scale the data, or set dtype: float64")


def check_indices(ds: Dataset, layer: str, high: int | None = None) -> None:
    """A model that starts with an index-taking layer (Embedding) needs whole-number features in
    [0, high): casting 0.37 to an index would silently read row 0, and an index past the table
    is named here with its sample, not by the layer with none."""
    for x, val in ((ds.x, False), (ds.x_val, True)):
        if x is None or not len(x) or x.dtype.kind not in "fiu":
            continue
        i = first_row(x, lambda b: (b != np.round(b)).any(axis=1)) if x.dtype.kind == "f" else None
        if i is not None:
            v = np.asarray(x[i]).ravel()
            raise DataError(f"{ds.where(i, val)}: {layer} takes integer indices, got {v[v != np.round(v)][0]:g}")
        if high is None:
            continue
        i = first_row(x, lambda b: ((b < 0) | (b >= high)).any(axis=1))
        if i is not None:
            v = np.asarray(x[i]).ravel()
            v = v[(v < 0) | (v >= high)][0]
            raise DataError(f"{ds.where(i, val)}: {layer} takes indices in [0, {high}), got {v:g}; raise "
                            f"input_dim or check the data")


def load_data(config, fitted: Preprocessing | None = None, holdout: bool = True) -> Dataset:
    """Generate or read a config's data (a :class:`~dlrun.config.Config`), split off the
    validation data (seeded, stratified) and preprocess both parts (``data.preprocess``, fitted on
    the training part only, or ``fitted``: a run's own, from its checkpoint), with errors placed
    at the config key that caused them. ``holdout=False``: no split (every sample as training
    data, as the model sees it: gradcheck's)."""
    split_seed = seeding.split_seed(config.seed, config.train.split_seed) if holdout else None
    settings = getattr(config, "preprocess", None)
    try:
        ds = config.build("data")
        if not isinstance(ds, Dataset):  # a plugin generator's return
            raise ContractError(f"the data generator {config.data!r} returned {type(ds).__name__}; expected a "
                                f"dlrun.data.Dataset(x, y)", config.locate("data"))
        if ds.x_val is not None and config.train.validation_split > 0:
            given = "data.validation_path" if ds.name_val else f"the data generator {ds.name!r}"
            raise ConfigError(f"{config.train.validation_split} asks for a split, but {given} already gives the "
                              f"validation samples; set train.validation_split to 0 (or leave it out)",
                              config.locate("train.validation_split"))
        name_labels(ds, fitted.classes if fitted is not None else None)
        if isinstance(ds.x, Rows) and (settings is not None or fitted is not None):
            raise DataError(f"{ds.name}: data.preprocess transforms samples in memory, but memory_map reads them from "
                            f"the file a batch at a time; scale the array before saving it, or set memory_map: false",
                            config.locate("data.preprocess") if settings is not None else config.locate("data"))
        if fitted is None:  # a missing value is named by its row in the file, before any split
            refuse_missing(ds, settings)
        if holdout and ds.x_val is None and config.train.validation_split > 0:  # split the samples' places, then the data
            keep, _, held, _ = split(np.arange(len(ds.x)), ds.y, config.train.validation_split, split_seed,
                                     shares=config.split_shares)
    except DataError as e:  # errors without a file line get the config line that caused them
        if e.where is None and getattr(e, "option", None):
            e.where = config.locate(f"data.{e.option}")
        elif e.where is None and "validation_split" in e.message:
            e.where = config.locate("train.validation_split")
        elif e.where is None and "not found" in e.message:
            e.where = config.locate("data")
        raise
    if holdout and ds.x_val is None and config.train.validation_split > 0:
        rows, rows_val = (ds.rows[keep], ds.rows[held]) if ds.rows is not None else (None, None)  # CSV lines
        if isinstance(ds.x, Rows):  # (mapped rows stay in their file)
            x, x_val = ds.x.subset(keep), ds.x.subset(held)
        elif ds.owned and isinstance(ds.x, np.ndarray) and ds.x.flags.writeable:
            x_val = ds.x[held]
            x = take_in_place(ds.x, keep)
        else:
            x, x_val = ds.x[keep], ds.x[held]
        ds = Dataset(x, ds.y[keep], x_val, ds.y[held], name=ds.name, rows=rows, rows_val=rows_val,
                     samples=keep, samples_val=held, columns=ds.columns, target=ds.target, classes=ds.classes)
    if len(ds.x) == 0:
        raise DataError(f"data {ds.name!r} has no training samples")
    return apply_preprocessing(ds, fitted or fit_preprocessing(ds, settings))


def take_in_place(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``x[keep]`` for ascending ``keep``, written over the first rows of ``x`` a piece at a time
    (row keep[i] >= i moves to row i), so that a split holds no second copy of the training data;
    for arrays no one else holds."""
    step = max(1, SCAN_BYTES // max(1, x.dtype.itemsize * int(np.prod(x.shape[1:], dtype=np.int64))))
    for s in range(0, len(keep), step):
        piece = keep[s:s + step]
        x[s:s + len(piece)] = x[piece]
    return x[:len(keep)]


def name_labels(ds: Dataset, classes: list[str] | None = None) -> None:
    """Class names as labels (a CSV's yes/no) become indices into ``classes`` (default: the training
    data's names, sorted); a name not among them is named with its file and line."""
    if ds.y.dtype.kind != "U":
        return
    if classes is None and ds.classes is None:
        classes = sorted(set(np.unique(ds.y).tolist()))
    ds.classes = classes or ds.classes
    ds.y = encode_labels(ds.y, ds.classes, ds.where, ds.target)
    if ds.y_val is not None:
        ds.y_val = encode_labels(ds.y_val, ds.classes, lambda i: ds.where(i, True), ds.target)


def refuse_missing(ds: Dataset, settings: Settings | None) -> None:
    """A DataError naming the first missing value of ``ds`` (all of it, before a split) unless
    ``settings.missing`` fills them."""
    if settings is not None and settings.missing != "refuse":
        return
    for x, val in ((ds.x, False), (ds.x_val, True)):
        numbers = x.numbers if isinstance(x, Table) else x
        if x is not None and (first_row(numbers, lambda b: np.isnan(b).any(axis=1)) is not None  # (a piece at a time)
                              or (isinstance(x, Table) and (x.text == "").any())):
            fit(Settings(), x, lambda i: ds.where(i, val), ds.columns)


def fit_preprocessing(ds: Dataset, settings: Settings | None) -> Preprocessing | None:
    """The preprocessing of ``ds``'s training part: what ``settings`` asks for, the encoding of
    categorical columns and the class names, which a model's inputs and outputs need; None when
    there is nothing to learn (samples used as they are)."""
    if settings is None and not isinstance(ds.x, Table) and ds.classes is None:
        return None
    return fit(settings or Settings(), ds.x, ds.where, ds.columns, ds.classes, ds.target)


def apply_preprocessing(ds: Dataset, fitted: Preprocessing | None) -> Dataset:
    """``ds`` with ``fitted`` applied to its training and validation samples (and recorded)."""
    if fitted is None:
        return ds
    ds.x = fitted.transform(ds.x, ds.where, ds.name)
    if ds.x_val is not None:
        ds.x_val = fitted.transform(ds.x_val, lambda i: ds.where(i, True), ds.name_val or ds.name)
    ds.preprocess = fitted
    ds.classes = fitted.classes if fitted.classes is not None else ds.classes
    return ds
