"""Using a trained model: rebuild it from a checkpoint alone, read inputs, and tabulate predictions.

The checkpoint records the resolved config, so no YAML file is needed. A checkpoint never runs
code: the plugin files its model needs must be named with ``--plugin`` (a recorded plugin that
was not is an error saying which flag to pass); a named file whose source changed since the
checkpoint was written gives a warning (returned, for the CLI to print).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from . import checkpoint, evaluation, snapshot
from .. import metrics, registry
from ..training import step
from .assembly import build_model
from ..config import Config, config_from_dict
from ..config.source import parse_value
from ..data import Dataset, check_range, load_data
from ..data.files import expect_npy, read_csv
from ..losses import Loss
from ..errors import CheckpointError, DataError, DlrunError, PluginError, UsageError
from ..model import Sequential
from ..registry.plugins import named_for
from ..training.preflight import check_labels, check_model_indices


@dataclass
class Restored:
    """A model rebuilt from a checkpoint, with its config and loss."""

    path: Path
    config: Config
    model: Sequential
    loss: object
    meta: dict
    warnings: list[str] = field(default_factory=list)

    @property
    def classification(self) -> bool:
        return getattr(self.loss, "task", "classification") == "classification"

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int | None = None) -> evaluation.Evaluation:
        """What ``dlrun evaluate`` reports on (x, y): one forward pass, no optimizer; the loss
        includes the run's regularization, as val_loss does, and the run's train.metrics."""
        cfg = self.config
        outputs = self.model.output_shape[-1] if self.model.output_shape else 1
        tracker = metrics.Tracker(metrics.build(cfg.train.metrics, self.loss, outputs, cfg.locate), self.model.backend)
        penalty = step.penalty(step.regularized(self.model, cfg.build("regularizer")))
        return evaluation.evaluate(self.model, self.loss, x, y, batch_size or cfg.train.batch_size, penalty, tracker)


def open_model(target: str | Path, device: str | None = None) -> Restored:
    """Rebuild the model a checkpoint (or a run directory's best/last checkpoint) holds."""
    path = checkpoint.resolve(target)
    ckpt = checkpoint.read(path)
    meta = ckpt.meta
    if "config" not in meta or "input_shape" not in meta:
        raise CheckpointError(f"{path}: the checkpoint records no config or input shape; it cannot be rebuilt")
    recorded, warnings = named_for(meta["config"], meta.get("plugins"), path)  # (files given with --plugin)
    try:
        config = config_from_dict(recorded, device=device, origin=f"{path} (recorded config)", run_plugins=False)
    except PluginError:
        raise
    except DlrunError as e:
        raise CheckpointError(f"{path}: the recorded config no longer validates with this dlrun: {e}") from None
    config.split_shares = meta.get("split_shares", "per_class")  # the run's split, for its validation data
    model = build_model(config, meta["input_shape"])
    snapshot.load_weights(model, ckpt)
    return Restored(path, config, model, config.build("loss"), meta, warnings)


def shape_features(x: np.ndarray, input_shape: tuple, where: str) -> np.ndarray:
    """Check (and reshape flat rows to) the model's per-sample input shape."""
    want = int(np.prod(input_shape))
    if x.ndim == 1 and want == 1:
        x = x[:, None]
    if x.ndim < 2:
        raise DataError(f"{where}: expected one sample per row, got an array of shape {x.shape}")
    if tuple(x.shape[1:]) == tuple(input_shape):
        return x
    squeezed = lambda shape: tuple(d for d in shape if d != 1)  # noqa: E731
    if x.ndim > 2 and squeezed(x.shape[1:]) != squeezed(input_shape):
        # shaped samples are taken as they are ((8, 8) for (1, 8, 8) is fine), never re-cut:
        # a (1, 4, 16) image holds 64 values but is not a (1, 8, 8) one
        raise DataError(f"{where}: samples of shape {tuple(x.shape[1:])}, but the model expects "
                        f"{tuple(input_shape)} (or flat rows of {want} values)")
    got = int(np.prod(x.shape[1:]))
    if got != want:
        use = "" if where.startswith("--data") else ", or use dlrun evaluate"  # (evaluate's own --data)
        hint = f" (if the last column holds labels, drop it{use})" if got == want + 1 else ""
        raise DataError(f"{where}: {got} features per sample, but the model expects {want} "
                        f"(input shape {tuple(input_shape)}){hint}")
    return x.reshape((len(x),) + tuple(input_shape))


def read_features(path: str | Path, input_shape: tuple, dtype=np.float64, model=None) -> np.ndarray:
    """Features from a CSV (header optional, detected) or .npy file, shaped for the model (whose
    floating-point type is ``dtype``; given the ``model``, index inputs are checked too)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"input file not found: {p}")
    try:
        if p.suffix.lower() == ".npy":
            expect_npy(p)
            x = np.load(p, allow_pickle=False)
            if not isinstance(x, np.ndarray):  # an .npz archive under an .npy name
                x.close()
                raise DataError(f"{p}: holds an .npz archive, not one array; save the features with numpy.save")
        elif p.suffix.lower() == ".npz":
            raise DataError(f"{p}: expected a CSV or .npy file of features, got an .npz archive")
        else:
            x, _, _ = read_csv(p, None, None)
    except ValueError as e:
        raise DataError(f"{p}: cannot read the file ({e})") from None
    except OSError as e:
        raise DataError(f"{p}: cannot read the file ({e.strerror or e})") from None
    if x.dtype.kind not in "biuf":
        raise DataError(f"{p}: expected numbers, got an array of dtype {x.dtype}")
    if x.ndim and len(x) == 0:  # (a 0-d array is refused by shape_features)
        raise DataError(f"{p}: the file holds no samples")
    x = shape_features(np.asarray(x, dtype=np.float64), input_shape, str(p))
    bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if bad.any():
        raise DataError(f"{p}: sample {int(np.flatnonzero(bad)[0]) + 1}: features contain NaN or inf")
    ds = Dataset(x, np.zeros(len(x), np.int64), name=str(p))
    check_range(ds, dtype)
    if model is not None:
        check_model_indices(ds, model)
    return x


@dataclass
class PredictionTable:
    """Column names, a 2-D array of values (one row per input), and a printf format per column."""

    columns: list[str]
    values: np.ndarray
    formats: list[str]


def predictions(restored: Restored, x: np.ndarray, proba: bool = False, batch_size: int | None = None) -> PredictionTable:
    """``prediction`` (class index, or the value(s) for regression) and optional ``proba_<k>`` columns."""
    if proba and not restored.classification:
        raise UsageError(f"--proba needs a classification model; this one is trained with "
                         f"{type(restored.loss).__name__}, a {restored.loss.task} loss")
    loss = restored.loss
    if proba and getattr(type(loss), "probabilities", Loss.probabilities) is Loss.probabilities:
        raise UsageError(f"--proba: the loss {type(loss).__name__} defines no probabilities(z) (Hinge scores classes "
                         f"by margins); drop --proba, train with SoftmaxCrossEntropy, BinaryCrossEntropy or NLL, "
                         f"or give your loss a probabilities(z) method (docs/custom-layers.md)")
    z = restored.model.predict(x, batch_size or restored.config.train.batch_size)
    if restored.classification:
        cols, vals, fmts = ["prediction"], [np.asarray(loss.predict(z))[:, None].astype(np.float64)], ["%d"]
        if proba:
            p = np.asarray(loss.probabilities(z.astype(np.float64)))
            cols += [f"proba_{k}" for k in range(p.shape[1])]
            vals.append(p)
            fmts += ["%.9g"] * p.shape[1]
        return PredictionTable(cols, np.concatenate(vals, axis=1), fmts)
    out = np.asarray(loss.predict(z)).reshape(len(z), -1).astype(np.float64)
    cols = ["prediction"] if out.shape[1] == 1 else [f"prediction_{k}" for k in range(out.shape[1])]
    return PredictionTable(cols, out, ["%.9g"] * out.shape[1])


def write_csv(table: PredictionTable, f: TextIO) -> None:
    """The table as CSV: a header row, then one row per input."""
    f.write(",".join(table.columns) + "\n")
    if len(table.values):
        np.savetxt(f, table.values, fmt=table.formats, delimiter=",")


def save_csv(table: PredictionTable, path: str | Path) -> None:
    """Write the table to ``path`` atomically: a failure mid-write (full disk, Ctrl-C) leaves no
    partial file, and a file already there intact. A path that exists but is not a regular file
    (``/dev/null``, a pipe) is written directly, never replaced."""
    path = Path(path)
    if path.exists() and not path.is_file():
        with open(path, "w", newline="") as f:
            write_csv(table, f)
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", newline="") as f:
            write_csv(table, f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _is_file(spec: str) -> bool:
    """Whether ``spec`` names a file (a spec too long to be a path, or otherwise unusable as one, is not)."""
    try:
        return Path(spec).is_file()
    except (OSError, ValueError):
        return False


def evaluation_data(restored: Restored, spec: str | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(x, y, description): the run's validation data, or a data file / generator spec."""
    cfg = restored.config
    if spec is None:
        ds = load_data(cfg)
        check_model_indices(ds, restored.model)
        if ds.x_val is not None and len(ds.x_val) and ds.name_val:
            return ds.x_val, ds.y_val, f"validation data {ds.name_val} (data.validation_path of the recorded config)"
        if ds.x_val is not None and len(ds.x_val):
            return ds.x_val, ds.y_val, f"validation split of {ds.name} (re-created from the recorded config)"
        return ds.x, ds.y, f"training data of {ds.name} (the run has no validation split)"
    if _is_file(spec):
        value = {"type": "file", "path": str(Path(spec).resolve()), "task": restored.loss.task}
    else:
        value = parse_value(spec, "--data")
        if isinstance(value, str) and value not in registry.data:
            raise DataError(f"--data {spec!r}: no such file, and no data generator of that name "
                            f"(data generators: {', '.join(registry.data.names())})")
    ds: Dataset = registry.data.build(value, "--data")
    check_range(ds, restored.model.dtype)
    check_model_indices(ds, restored.model)
    check_labels(ds, restored.model, restored.loss)  # a label the model has no output for, with file:line
    x, y = ds.x, ds.y
    if ds.x_val is not None:
        x, y = np.concatenate([x, ds.x_val]), np.concatenate([y, ds.y_val])
    x = shape_features(np.asarray(x), restored.model.input_shape, f"--data {spec}")
    return x, y, f"{ds.name} from --data {spec}"
