"""A training run from a config: data, model, trainer, and the run directory it writes.

Layout of a run directory ``RUNS_DIR/<name>-<YYYYmmdd-HHMMSS>/``:

* ``config.yaml``  — the resolved config, including the seed actually used;
* ``metrics.csv``  — one row per epoch, appended as training goes;
* ``summary.json`` — final metrics, epochs, seconds;
* ``checkpoints/last.npz`` — the weights (see :mod:`dlrun.checkpoint`).
"""
from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from . import __version__, checkpoint
from .backend import get_backend
from .config import Config, dump_yaml
from .data import Dataset, split
from .errors import DataError, Interrupted, NonFiniteError, TrainingError
from .faults import StopOnSignal, catch_signals
from .model import Sequential
from .trainer import Callback, History, Trainer

METRIC_COLUMNS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "learning_rate", "seconds")


def resolve_seed(config: Config) -> int:
    """The config's seed, or a fresh one recorded into ``config.raw``."""
    if config.seed is None:
        config.seed = int(np.random.SeedSequence().entropy % (2**31))
    config.raw["seed"] = config.seed
    return config.seed


def load_data(config: Config) -> Dataset:
    """Generate or read the data and split off validation data (seeded, stratified)."""
    try:
        ds = config.build("data")
        if ds.x_val is None and config.train.validation_split > 0:
            x, y, xv, yv = split(ds.x, ds.y, config.train.validation_split, config.seed)
    except DataError as e:  # errors without a file line get the config line that caused them
        if e.where is None and "validation_split" in e.message:
            e.where = config.locate("train.validation_split")
        elif e.where is None and "not found" in e.message:
            e.where = config.locate("data")
        raise
    if ds.x_val is None and config.train.validation_split > 0:
        rows = rows_val = None
        if ds.rows is not None:  # the same split of the file lines, for errors naming a row
            keep, _, held, _ = split(np.arange(len(ds.x)), ds.y, config.train.validation_split, config.seed)
            rows, rows_val = ds.rows[keep], ds.rows[held]
        ds = Dataset(x, y, xv, yv, name=ds.name, rows=rows, rows_val=rows_val)
    if len(ds.x) == 0:
        raise DataError(f"data {ds.name!r} has no training samples")
    return ds


def build_model(config: Config, input_shape, backend=None) -> Sequential:
    """Layers from the config, built for ``input_shape`` on the config's device."""
    backend = backend or get_backend(config.device)
    return Sequential(config.build_layers(), input_shape, backend, config.dtype, config.seed, config.locate)


def check_labels(ds: Dataset, model: Sequential, loss) -> None:
    """Fail early when labels cannot index the model's outputs."""
    if getattr(loss, "task", "classification") != "classification":
        return
    if ds.y.dtype.kind not in "iu":
        raise DataError(f"data {ds.name!r}: a classification loss needs integer labels, got {ds.y.dtype} targets")
    out = model.output_shape[-1] if model.output_shape else 1
    for y, val in ((ds.y, False), (ds.y_val, True)):
        if y is not None and (y >= out).any():
            i = int(np.flatnonzero(y >= out)[0])
            raise DataError(f"{ds.where(i, val)}: label {int(y[i])} is out of range: the model outputs {out} "
                            f"scores, so labels must lie in 0..{out - 1} (set the last layer's units to "
                            f"{ds.num_classes})")


def new_run_dir(runs_dir: str | Path, name: str) -> Path:
    """Create ``runs_dir/<name>-<timestamp>``; never reuse an existing folder."""
    runs_dir = Path(runs_dir)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainingError(f"cannot create the runs directory {runs_dir}: {e.strerror}") from None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        d = runs_dir / (f"{name}-{stamp}" + (f"-{i + 1}" if i else ""))
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
        except OSError as e:
            raise TrainingError(f"cannot create a run directory in {runs_dir}: {e.strerror}") from None
    raise TrainingError(f"too many runs named {name}-{stamp} in {runs_dir}")


class RunWriter(Callback):
    """Writes metrics.csv (a row per epoch, flushed) into the run directory."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.csv"

    def on_epoch_end(self, epoch, metrics):
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(METRIC_COLUMNS)
            w.writerow(["" if metrics.get(c) is None else metrics[c] for c in METRIC_COLUMNS])


@dataclass
class RunResult:
    run_dir: Path
    summary: dict
    history: History
    trainer: Trainer


def prepare(config: Config):
    """Everything a run needs, built and checked before any file is written."""
    resolve_seed(config)
    backend = get_backend(config.device)
    ds = load_data(config)
    model = build_model(config, ds.input_shape, backend)
    loss = config.build("loss")
    check_labels(ds, model, loss)
    trainer = Trainer(model, loss, config.build("optimizer"), config.build("regularizer"),
                      config.train.batch_size, config.train.shuffle, config.seed)
    return ds, trainer


def save_checkpoint(path: Path, trainer: Trainer, config: Config, extra: dict | None = None) -> Path:
    meta = {"dlrun_version": __version__, "epoch": trainer.epoch, "step": trainer.step,
            "config": config.raw, "input_shape": list(trainer.model.input_shape),
            "dtype": str(trainer.model.dtype), **(extra or {})}
    return checkpoint.save(path, trainer.model.state_arrays(), trainer.optimizer.state_dict(), meta)


def train(config: Config, runs_dir: str | Path = "runs", callbacks=()) -> RunResult:
    """Run ``dlrun train``: build, create the run directory, fit, write summary and checkpoint.

    SIGINT/SIGTERM stop at a batch boundary and save a checkpoint (Interrupted); a non-finite
    value stops with NonFiniteError after saving the last good state; a failed write (disk full,
    no permission) raises TrainingError and leaves the previous checkpoint intact.
    """
    ds, trainer = prepare(config)
    run_dir = new_run_dir(runs_dir, config.name)
    ckpt = run_dir / "checkpoints" / "last.npz"
    stop = StopOnSignal()
    try:
        with catch_signals(stop), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            (run_dir / "config.yaml").write_text(dump_yaml(config.raw))
            t0 = time.perf_counter()
            try:
                history = trainer.fit(ds.x, ds.y, ds.x_val, ds.y_val, epochs=config.train.epochs,
                                      callbacks=[RunWriter(run_dir), *callbacks, stop])
            except Interrupted as e:
                if e.immediate:
                    raise
                save_checkpoint(ckpt, trainer, config, {"interrupted": stop.record()})
                raise Interrupted(f"{e.message}\ncheckpoint saved: {ckpt}\n"
                                  f"resume with: dlrun train --resume {run_dir}", e.signum) from None
            except NonFiniteError as e:
                if trainer.epoch > 0:  # the guard restored the state after the last good epoch
                    save_checkpoint(ckpt, trainer, config)
                    e.message += f"\nthe last good checkpoint (epoch {trainer.epoch}) is {ckpt}"
                raise
            seconds = time.perf_counter() - t0
            save_checkpoint(ckpt, trainer, config)
    except OSError as e:
        raise TrainingError(f"cannot write {e.filename or run_dir}: {e.strerror or e} (errno {e.errno}); "
                            f"any earlier checkpoint in {run_dir} is intact") from None
    last = history.last
    summary = {k: last.get(k) for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy")}
    summary.update({"epochs": trainer.epoch, "seconds": round(seconds, 4), "seed": config.seed,
                    "device": config.device, "parameters": trainer.model.num_parameters})
    tmp = run_dir / ".summary.json.tmp"
    try:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, run_dir / "summary.json")
    except OSError as e:
        raise TrainingError(f"cannot write {run_dir / 'summary.json'}: {e.strerror or e}; "
                            f"the checkpoint {ckpt} is complete") from None
    return RunResult(run_dir, summary, history, trainer)
