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
from ..config import LEGACY_DATA_OPTIONS, Config, config_from_dict
from ..config.source import parse_value
from ..registry.options import did_you_mean
from ..data import Dataset, apply_preprocessing, check_range, load_data, name_labels, refuse_missing
from ..data import table
from ..data.files import expect_npy, read_csv, read_rows
from ..data.preprocess import Preprocessing
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
    preprocess: Preprocessing | None = None  # fitted on the run's training split; None: inputs used as given

    @property
    def classification(self) -> bool:
        return getattr(self.loss, "task", "classification") == "classification"

    @property
    def classes(self) -> list[str] | None:
        """The class names the run learned (label k is classes[k]), or None."""
        return None if self.preprocess is None else self.preprocess.classes

    @property
    def delimiter(self) -> str:
        """The run's CSV delimiter (data.delimiter of its file), for prediction inputs."""
        spec = self.config.data
        return spec.get("delimiter", ",") if isinstance(spec, dict) and spec.get("type") == "file" else ","

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int | None = None) -> evaluation.Evaluation:
        """What ``dlrun evaluate`` reports on (x, y): one forward pass, no optimizer; the loss
        includes the run's regularization, as val_loss does, and the run's train.metrics."""
        cfg = self.config
        outputs = self.model.output_shape[-1] if self.model.output_shape else 1
        tracker = metrics.Tracker(metrics.build(cfg.train.metrics, self.loss, outputs, cfg.locate), self.model.backend)
        penalty = step.penalty(step.regularized(self.model, cfg.build("regularizer")))
        result = evaluation.evaluate(self.model, self.loss, x, y, batch_size or cfg.train.batch_size, penalty, tracker)
        result.classes = self.classes if result.confusion is not None else None
        return result


def open_model(target: str | Path, device: str | None = None) -> Restored:
    """Rebuild the model a checkpoint (or a run directory's best/last checkpoint) holds."""
    path = checkpoint.resolve(target)
    ckpt = checkpoint.read(path)
    meta = ckpt.meta
    if "config" not in meta or "input_shape" not in meta:
        raise CheckpointError(f"{path}: the checkpoint records no config or input shape; it cannot be rebuilt")
    recorded, warnings = named_for(meta["config"], meta.get("plugins"), path)  # (files given with --plugin)
    try:
        config = config_from_dict(recorded, device=device, origin=f"{path} (recorded config)", run_plugins=False,
                                  from_checkpoint=True)
    except PluginError:
        raise
    except DlrunError as e:
        raise CheckpointError(f"{path}: the recorded config no longer validates with this dlrun: {e}") from None
    config.split_shares = meta.get("split_shares", "per_class")  # the run's split, for its validation data
    model = build_model(config, meta["input_shape"])
    snapshot.load_weights(model, ckpt)
    return Restored(path, config, model, config.build("loss"), meta, warnings, snapshot.recorded_preprocessing(ckpt))


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


def read_features(path: str | Path, input_shape: tuple, dtype=np.float64, model=None,
                  preprocess: Preprocessing | None = None, delimiter: str = ",") -> np.ndarray:
    """Features from a CSV (header optional, detected) or .npy file, shaped for the model (whose
    floating-point type is ``dtype``; given the ``model``, index inputs are checked too). With the
    run's ``preprocess``, the file holds raw inputs: columns by the header's names where the run
    had them (a CSV that names the columns may hold others too, the label among them), scaled and
    encoded as the run's training data was."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"input file not found: {p}")
    lines = None
    try:
        if p.suffix.lower() == ".npy":
            expect_npy(p)
            x = np.load(p, allow_pickle=False)
            if not isinstance(x, np.ndarray):  # an .npz archive under an .npy name
                x.close()
                raise DataError(f"{p}: holds an .npz archive, not one array; save the features with numpy.save")
        elif p.suffix.lower() == ".npz":
            raise DataError(f"{p}: expected a CSV or .npy file of features, got an .npz archive")
        elif preprocess is not None:
            x, lines = _raw_inputs(p, preprocess, delimiter)
        else:
            x, _, _ = read_csv(p, None, None, delimiter)
    except ValueError as e:
        raise DataError(f"{p}: cannot read the file ({e})") from None
    except OSError as e:
        raise DataError(f"{p}: cannot read the file ({e.strerror or e})") from None
    if isinstance(x, np.ndarray) and x.dtype.kind not in "biuf":
        raise DataError(f"{p}: expected numbers, got an array of dtype {x.dtype}")
    if (x.ndim > 0 if isinstance(x, np.ndarray) else True) and len(x) == 0:  # (shape_features refuses 0-d)
        raise DataError(f"{p}: the file holds no samples")
    if preprocess is not None:
        where = (lambda i: f"{p}:{int(lines[i])}") if lines is not None else (lambda i: f"{p}: sample {i + 1}")  # noqa: E731
        if isinstance(x, np.ndarray):
            x = shape_features(np.asarray(x, dtype=np.float64), preprocess.shape, str(p))
        x = preprocess.transform(x, where, str(p))
    x = shape_features(np.asarray(x, dtype=np.float64), input_shape, str(p))
    bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if bad.any():
        raise DataError(f"{p}: sample {int(np.flatnonzero(bad)[0]) + 1}: features contain NaN or inf")
    ds = Dataset(x, np.zeros(len(x), np.int64), name=str(p))
    check_range(ds, dtype)
    if model is not None:
        check_model_indices(ds, model)
    return x


def _raw_inputs(p: Path, preprocess: Preprocessing, delimiter: str):
    """(raw features, file line of each row) of a CSV of prediction inputs: by the header's names
    when the run's columns had names and the file's first row names them all, else by place."""
    rows, lines = read_rows(p, delimiter)
    if not rows:
        raise DataError(f"{p}: the file has no rows")
    columns = preprocess.columns
    head = {c.strip() for c in rows[0]}
    if columns is not None and (head & set(columns)):
        missing = [c for c in columns if c not in head]
        if missing:
            raise DataError(f"{p}:{lines[0]}: no column {missing[0]!r} in the header{did_you_mean(missing[0], head)}; "
                            f"the model takes the columns {', '.join(columns)}")
        cats = [c for c, k in zip(columns, preprocess.categorical or [False] * len(columns)) if k]
        parsed = table.parse(p, rows, lines, header=True, label_column=None, features=columns,
                             categorical=cats or None, delimiter=delimiter)
    elif preprocess.tabular:
        raise DataError(f"{p}:{lines[0]}: expected a header row naming the columns {', '.join(columns)} (the model "
                        f"takes categorical columns by name), got {', '.join(c.strip() for c in rows[0][:6])}")
    else:
        parsed = table.parse(p, rows, lines, header=None, label_column=None, delimiter=delimiter)
    return parsed.x, parsed.lines


@dataclass
class PredictionTable:
    """Column names, a 2-D array of values (one row per input), and a printf format per column;
    with ``classes``, the first column's class indices are written as those names."""

    columns: list[str]
    values: np.ndarray
    formats: list[str]
    classes: list[str] | None = None


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
        classes = restored.classes
        cols, vals, fmts = ["prediction"], [np.asarray(loss.predict(z))[:, None].astype(np.float64)], ["%d"]
        if proba:
            p = np.asarray(loss.probabilities(z.astype(np.float64)))
            named = classes is not None and len(classes) == p.shape[1]
            cols += [f"proba_{classes[k] if named else k}" for k in range(p.shape[1])]
            vals.append(p)
            fmts += ["%.9g"] * p.shape[1]
        return PredictionTable(cols, np.concatenate(vals, axis=1), fmts, classes)
    out = np.asarray(loss.predict(z)).reshape(len(z), -1).astype(np.float64)
    cols = ["prediction"] if out.shape[1] == 1 else [f"prediction_{k}" for k in range(out.shape[1])]
    return PredictionTable(cols, out, ["%.9g"] * out.shape[1])


def write_csv(table: PredictionTable, f: TextIO) -> None:
    """The table as CSV: a header row, then one row per input."""
    f.write(",".join(map(_cell, table.columns)) + "\n")
    if not len(table.values):
        return
    if table.classes is None:
        np.savetxt(f, table.values, fmt=table.formats, delimiter=",")
        return
    names = np.asarray([_cell(c) for c in table.classes] + ["?"])  # (an index past the names: a model with more outputs)
    idx = np.minimum(table.values[:, 0].astype(np.int64), len(names) - 1)
    cells = [names[idx]] + [np.char.mod(fmt, table.values[:, k]) for k, fmt in enumerate(table.formats) if k]
    np.savetxt(f, np.stack(cells, axis=1), fmt="%s", delimiter=",")


def _cell(text: str) -> str:
    """A CSV cell: quoted when it holds a comma, a quote or a line break."""
    return f'"{text.replace(chr(34), 2 * chr(34))}"' if any(c in text for c in ',"\r\n') else text


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


FILE_OPTIONS = ("label_column", "header", "target", "features", "categorical", "delimiter")


def run_data(restored: Restored) -> Dataset:
    """The run's data as its recorded config makes it (its training data and validation split,
    preprocessed as the run's was), checked against the model."""
    ds = load_data(restored.config, restored.preprocess)
    check_model_indices(ds, restored.model)
    return ds


def _legacy_differences(recorded, given, spec: str) -> list[str]:
    """Warnings for a --data generator spec that leaves out a transforming option the run's data
    had (iris' standardize, recorded by runs from before data.preprocess): its model takes inputs
    transformed so, and would be evaluated on raw ones."""
    if not isinstance(recorded, dict):
        return []
    name = given.get("type") if isinstance(given, dict) else given
    options = given if isinstance(given, dict) else {}
    return [f"--data {spec}: the run's data was {{type: {name}, {key}: true}}, which its model takes; this is "
            f"{{type: {name}}} without it: give --data '{{type: {name}, {key}: true}}' to evaluate on the inputs "
            f"the model was trained on"
            for (kind, key) in LEGACY_DATA_OPTIONS if kind == name == recorded.get("type")
            and recorded.get(key) is True and options.get(key) is not True]


def evaluation_data(restored: Restored, spec: str | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(x, y, description): the run's validation data, or a data file / generator spec, raw data
    preprocessed as the run's training data was."""
    cfg = restored.config
    prep = restored.preprocess
    if spec is None:
        ds = run_data(restored)
        if ds.x_val is not None and len(ds.x_val) and ds.name_val:
            return ds.x_val, ds.y_val, f"validation data {ds.name_val} (data.validation_path of the recorded config)"
        if ds.x_val is not None and len(ds.x_val):
            return ds.x_val, ds.y_val, f"validation split of {ds.name} (re-created from the recorded config)"
        return ds.x, ds.y, f"training data of {ds.name} (the run has no validation split)"
    if _is_file(spec):
        value = {"type": "file", "path": str(Path(spec).resolve()), "task": restored.loss.task}
        recorded = cfg.data if isinstance(cfg.data, dict) and cfg.data.get("type") == "file" else {}
        value.update({k: recorded[k] for k in FILE_OPTIONS if k in recorded})  # the run's columns and delimiter
    else:
        value = parse_value(spec, "--data")
        if isinstance(value, str) and value not in registry.data:
            raise DataError(f"--data {spec!r}: no such file, and no data generator of that name "
                            f"(data generators: {', '.join(registry.data.names())})")
        if isinstance(value, dict) and "preprocess" in value:
            raise DataError(f"--data {spec!r}: preprocess comes from the checkpoint (the run's, fitted on its training "
                            f"split); drop it from --data")
        restored.warnings.extend(_legacy_differences(cfg.data, value, spec))
    ds: Dataset = registry.data.build(value, "--data")
    if ds.y.dtype.kind == "U" and (prep is None or prep.classes is None):
        raise DataError(f"{ds.name}: labels are class names ({', '.join(np.unique(ds.y)[:5])}), but the model was "
                        f"trained on class numbers")
    if prep is not None:
        name_labels(ds, prep.classes)
        ds = apply_preprocessing(ds, prep)
    elif isinstance(ds.x, table.Table):
        raise DataError(f"{ds.name}: columns of categories ({', '.join(ds.x.text_names)}), but the model was trained "
                        f"on numbers only")
    else:
        refuse_missing(ds, None)
    check_range(ds, restored.model.dtype)
    check_model_indices(ds, restored.model)
    check_labels(ds, restored.model, restored.loss)  # a label the model has no output for, with file:line
    x, y = ds.x, ds.y
    if ds.x_val is not None:
        x, y = np.concatenate([x, ds.x_val]), np.concatenate([y, ds.y_val])
    x = shape_features(np.asarray(x), restored.model.input_shape, f"--data {spec}")
    return x, y, f"{ds.name} from --data {spec}"
