"""A training run from a config: data, model, trainer, and the run directory it writes.

A run directory ``RUNS_DIR/<name>-<YYYYmmdd-HHMMSS>/`` holds config.yaml, metrics.csv and
summary.json (:mod:`dlrun.runs.rundir`), and ``checkpoints/last.npz`` (the full training state every
``train.checkpoint_every`` epochs and at the end) and ``checkpoints/best.npz`` (the state at the
best ``train.monitor`` value; :mod:`dlrun.runs.snapshot`, docs/runs.md).
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import parallel
from ..backend import threads
from ..training import capture, controls, position
from . import checkpoint, rundir, snapshot, tensorboard
from ..config import Config, config_from_dict
from ..config.source import parse_yaml
from .assembly import Assembly, assemble
from .. import seeding
from ..data import Dataset, load_data
from ..data.preprocess import Settings
from ..errors import CheckpointError, ConfigError, DlrunError, Interrupted, NonFiniteError, TrainingError, UsageError
from ..training.faults import StopOnSignal, catch_signals
from ..registry.plugins import blame, named_for
from ..training.hooks import Callback, History
from ..training.preflight import chance_warning
from ..training.trainer import Trainer



@dataclass
class RunResult:
    """A finished run. ``signal``: a SIGINT/SIGTERM that arrived after the last epoch, too late to
    stop anything (the run finished; the caller reports it), else None."""

    run_dir: Path
    summary: dict
    history: History
    trainer: Trainer
    signal: int | None = None


def loggers(config: Config) -> list:
    """The ``train.loggers`` beside metrics.csv (which every run writes), built before anything is
    written: one whose package is missing is an error here."""
    return [tensorboard.TensorBoardLogger(config)] if "tensorboard" in config.train.loggers else []


def _fit(run: Assembly, run_dir: Path, callbacks, extra: dict, best: dict | None = None,
         seconds_before: float = 0.0, logs=()) -> RunResult:
    """Fit to ``train.epochs`` with the ``train:`` controls, the metrics and checkpoint writers
    and the ``logs`` (:func:`loggers`); write summary.json."""
    config, ds, trainer, train_controls = run.config, run.data, run.trainer, run.controls
    world = trainer.model.world
    # several ranks: they check that they start alike, and learn rank 0's run directory (it alone writes)
    run_dir = Path(world.start(_state_digest(trainer, ds) if world.size > 1 else "", run_dir=str(run_dir)
                               if run_dir is not None else None))
    writes = world.writes
    monitor, mode = run.monitor.name, run.monitor.mode
    # last.npz keeps the last epoch's weights: early stopping's best weights come back after it
    deferred = [c for c in train_controls if isinstance(c, controls.EarlyStopping)]
    for c in deferred:
        c.restore_at_end = False
    # best.npz holds the weights early stopping restores when both watch one metric: the same test
    restoring = [c for c in deferred if c.restore_best_weights and c.monitor == monitor and c.mode == mode]
    saved = {**extra, **snapshot.preprocess_meta(ds)}  # (the checkpoints' metadata; summary.json takes extra)
    writer = snapshot.CheckpointWriter(run_dir / "checkpoints", config, config.train.checkpoint_every,
                                       monitor, mode, best, saved, restoring[0].min_delta if restoring else 0.0)
    ckpt = run_dir / "checkpoints" / "last.npz"
    stop = StopOnSignal(config.train.epochs, deferred)
    start_step = trainer.step  # a resumed run that diverges before a good step leaves its checkpoint as it was
    try:
        # the handlers stay until summary.json is written: a signal after the last epoch is
        # reported once the run's ending is complete (stop.signum), never cuts it short
        with catch_signals(stop), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            t0 = time.perf_counter()
            try:
                metrics_csv = rundir.MetricsWriter(run_dir, trainer.tracker.names)
                for log in logs:
                    log.run_dir = run_dir
                # the controls observe an epoch before the writer records it; the loggers record
                # it once its checkpoint is written (several ranks: rank 0 alone writes and logs)
                every = ([metrics_csv, *train_controls, writer, *logs, *callbacks, stop] if writes
                         else [*train_controls, *callbacks, stop])
                history = trainer.fit(ds.x, ds.y, ds.x_val, ds.y_val, epochs=config.train.epochs, callbacks=every)
                stop.finishing = True
                for c in deferred:
                    c.restore_best()
            except Interrupted as e:
                if e.immediate:
                    raise
                # the state after the last finished batch (trainer.position says where in its
                # epoch), so that --resume continues exactly as an uninterrupted run would
                if writes:
                    writer.flush({"interrupted": stop.record(), **_digest(trainer, ds)})
                stopped = Interrupted(f"{e.message}\ncheckpoint {'after' if trainer.position else 'of'} {_at(trainer)} "
                                      f"saved: {ckpt}\nresume with: {_resume_command(world)}{run_dir}", e.signum)
                stopped.everywhere = getattr(e, "everywhere", False)
                raise stopped from None
            except NonFiniteError as e:
                if trainer.epoch > 0 or trainer.position is not None:  # the guard restored the last good state
                    if trainer.step > start_step and writes:  # (else it is the checkpoint resumed from, config included)
                        writer.flush(_digest(trainer, ds))
                    e.message += f"\nthe last good checkpoint ({_at(trainer)}) is {ckpt}"
                raise
            except (Exception, SystemExit, KeyboardInterrupt) as e:
                if isinstance(e, (DlrunError, OSError)):  # named where it was raised; a write that failed (below)
                    raise
                # code raised inside a batch (the trainer put the state back to where the epoch started
                # or resumed): keep that state, as for a non-finite value, and name the code
                named = plugin_fault(e)
                if trainer.step > start_step and writes:
                    writer.flush(_digest(trainer, ds))
                if named is None:  # a bug in dlrun itself: reported as an internal error
                    raise
                if ckpt.is_file():
                    named.message += f"\nthe last good checkpoint ({_at(trainer)}) is {ckpt}"
                raise named from None
            finally:
                for log in logs:  # (flushed on every ending: a stop, an error, the end)
                    log.close()
            seconds = time.perf_counter() - t0 + seconds_before
            summary = _summary(config, ds, trainer, run_dir, history, writer, extra, seconds) if writes else {}
    except OSError as e:
        kept = (f"the checkpoint {ckpt} is intact: once there is room, resume with: dlrun train --resume {run_dir}"
                if ckpt.is_file() else "no checkpoint had been written yet, so the run cannot be resumed "
                                       "(its metrics.csv keeps the epochs run)")
        raise TrainingError(f"cannot write {e.filename or run_dir}: {e.strerror or e} (errno {e.errno}); {kept}") from None
    return RunResult(run_dir, summary, history, trainer, stop.signum)


def _summary(config: Config, ds: Dataset, trainer: Trainer, run_dir: Path, history: History, writer, extra: dict,
             seconds: float) -> dict:
    """Write summary.json: the last epoch's metrics (metrics.csv's last row when this process ran
    no epoch: a resume that finishes a run whose ending was lost), the final model's on the
    training data, and the run's facts."""
    last = history.last or rundir.last_row(run_dir / "metrics.csv", trainer.epoch)
    summary = {k: last.get(k) for k in rundir.metric_columns(trainer.tracker.names)
               if k not in ("epoch", "learning_rate", "seconds")}
    final = trainer.evaluate(ds.x, ds.y)  # the saved weights, in evaluation mode (what predict sees)
    best = writer.best
    if best is not None:  # the epoch best.npz holds (what predict and evaluate take from a run directory)
        row = next((r for r in history.rows if r["epoch"] == best["epoch"]), None) \
            or rundir.last_row(run_dir / "metrics.csv", best["epoch"])
        summary["best_epoch_metrics"] = {k: row.get(k) for k in summary}
    stopped = [c.stopped_epoch for c in trainer.controls if isinstance(c, controls.EarlyStopping)]
    summary.update({"stopped_early": any(e == trainer.epoch for e in stopped if e is not None),
                    "final_train_loss": final["loss"], "final_train_accuracy": final["accuracy"],
                    **{f"final_train_{k}": v for k, v in final["metrics"].items()},
                    "epochs": trainer.epoch, "seconds": round(seconds, 4), "seed": config.seed,
                    "device": config.device, "parameters": trainer.model.num_parameters,
                    "best": writer.best, **extra})
    if config.device == "gpu":  # whether the step ran as a CUDA graph (train.cuda_graph)
        summary["cuda_graph"] = capture.status(trainer.training_step)
    ckpt = run_dir / "checkpoints" / "last.npz"
    try:
        rundir.write_json(run_dir / "summary.json", summary)
    except OSError as e:
        raise TrainingError(f"cannot write {run_dir / 'summary.json'}: {e.strerror or e}; "
                            f"the checkpoint {ckpt} is complete") from None
    return summary


def plugin_fault(e: BaseException) -> TrainingError | None:
    """The error to report for ``e``, raised while training by code other than dlrun's: a plugin's
    exception (named with its file:line), or a ``sys.exit`` / ``KeyboardInterrupt`` raised by code
    (a signal never raises inside training: :func:`catch_signals` turns it into a stop). None for
    an exception of dlrun's own."""
    named = blame(e)
    if named is None and isinstance(e, (SystemExit, KeyboardInterrupt)):
        did = f"sys.exit({e.code!r}) was called" if isinstance(e, SystemExit) else "KeyboardInterrupt was raised"
        named = TrainingError(f"training stopped: {did} during a training step by code outside dlrun's plugin files "
                              f"(run with --debug for the traceback)")
    return named


def _state_digest(trainer: Trainer, ds: Dataset) -> str:
    """A digest of what a rank starts training from: the weights, layer state, optimizer state
    and the training and validation data."""
    opt = trainer.optimizer.state_dict() if hasattr(trainer.optimizer, "state_dict") else {}
    data = [a for a in (ds.x, ds.y, ds.x_val, ds.y_val) if a is not None]
    return parallel.digest([*trainer.model.state_arrays().values(),
                            *(np.asarray(trainer.backend.to_host(v)) for _, v in sorted(opt.items())), *data])


def _resume_command(world) -> str:
    """How to resume: under mpiexec with the run's number of ranks (any other works too)."""
    return f"mpiexec -n {world.size} dlrun train --resume " if world.size > 1 else "dlrun train --resume "


def _digest(trainer: Trainer, ds) -> dict:
    """The training data's digest for a checkpoint taken inside an epoch (position.data_digest)."""
    return {} if trainer.position is None else {"data_digest": position.data_digest(ds.x, ds.y)}


def _at(trainer: Trainer) -> str:
    """Where the trainer's state stands: 'epoch 3', or 'batch 2 of 7 of epoch 4' inside an epoch."""
    return str(trainer.position) if trainer.position is not None else f"epoch {trainer.epoch}"


def train(config: Config, runs_dir: str | Path = "runs", callbacks=(), init_from: str | Path | None = None,
          warn=None) -> RunResult:
    """Run ``dlrun train``: build, create the run directory, fit, write summary and checkpoints.

    ``init_from`` (a checkpoint or run directory) supplies the initial weights; the optimizer
    starts fresh. Names and shapes must match the configured model exactly. ``warn(text)`` is
    called before training with each warning about the data (features of very different scales
    with no scaling, a first loss far above chance, validation samples the initial weights
    trained on).
    """
    world = parallel.current()
    with world.preparing():
        run = assemble(config)
        logs = loggers(config)
        extra = {"threads": threads.current()}  # the BLAS threads it trains with (summary.json)
        notes = list(run.warnings)
        if init_from is not None:
            ckpt = checkpoint.read(checkpoint.resolve(init_from))
            snapshot.load_weights(run.model, ckpt)
            extra["init_from"] = os.path.abspath(ckpt.path)
            notes.append(init_from_warning(config, run.data, ckpt))
        for note in filter(None, notes):
            if warn is not None:
                warn(note)
        if warn is not None and world.writes:  # (several ranks: rank 0 reports)
            callbacks = [FirstLossCheck(warn), *callbacks]
        run_dir = rundir.new_run_dir(runs_dir, config.name) if world.writes else None
    if not world.writes:  # another rank of several: rank 0 writes the run directory
        return _fit(run, None, callbacks, extra)
    try:
        with rundir.RunLock(run_dir):
            with world.preparing():
                rundir.write_config(run_dir, config)
                rundir.write_run_info(run_dir, config)
            return _fit(run, run_dir, callbacks, extra, logs=logs)
    except BaseException:  # a run that saved nothing leaves nothing behind (an interrupted one saves)
        rundir.discard_if_empty(run_dir)
        raise


class FirstLossCheck(Callback):
    """Calls ``warn`` once the first training step is done when its loss was far above chance
    level (:func:`~dlrun.training.preflight.chance_warning`); the value is read from the device
    after the step, once."""

    def __init__(self, warn):
        self.warn, self.first = warn, None

    def on_train_begin(self, trainer):
        self.trainer, self.first = trainer, trainer.training_step.first_check

    def on_batch_end(self, epoch, batch):
        if self.first is None or self.first.value is None:
            return
        value, self.first = float(self.first.value), None
        note = chance_warning(value, self.trainer.model, self.trainer.loss)
        if note:
            self.warn(note)


def init_from_warning(config: Config, ds: Dataset, ckpt: checkpoint.Checkpoint) -> str | None:
    """A warning when the run that ``ckpt`` comes from read other data or held out other validation
    samples (train.validation_split, the split seed) and this run's validation samples were among
    its training samples: the initial weights have seen them, so the validation figures flatter."""
    recorded = ckpt.meta.get("config")
    if ds.x_val is None or not len(ds.x_val) or not isinstance(recorded, dict):
        return None
    source = lambda spec: {k: v for k, v in spec.items() if k != "preprocess"} if isinstance(spec, dict) else spec  # noqa: E731
    before = recorded.get("train") if isinstance(recorded.get("train"), dict) else {}
    fraction = float(before.get("validation_split") or 0.0)
    seed = before.get("split_seed") if before.get("split_seed") is not None else recorded.get("seed")
    now = seeding.split_seed(config.seed, config.train.split_seed)
    same_data = source(recorded.get("data")) == source(config.data)
    changed = [what for what, differs in (("data", not same_data), ("validation_split", fraction != config.train.validation_split),
                                          ("split seed", fraction > 0 and seed != now)) if differs]
    if not changed:
        return None
    try:
        base_config = config_from_dict(recorded, origin=str(ckpt.path), run_plugins=False, from_checkpoint=True)
        base_config.split_shares = ckpt.meta.get("split_shares", "per_class")
        base = load_data(base_config)
        if same_data and base.samples is not None and ds.samples_val is not None:  # the same rows: by place
            seen = int(np.isin(ds.samples_val, base.samples).sum())
        else:  # by content, before preprocessing (each run fits its own)
            trained = _raw_rows(base_config.build("data"), base.samples)
            held = _raw_rows(config.build("data"), ds.samples_val, validation=ds.samples_val is None)
            seen = 0 if trained is None or held is None or trained.dtype != held.dtype else int(np.isin(held, trained).sum())
    except DlrunError:  # the base run's data is gone or unreadable: nothing to compare
        return None
    if not seen:
        return None
    return (f"--init-from {ckpt.path}: its run had other {', '.join(changed)}, and {seen} of this run's "
            f"{len(ds.x_val)} validation samples were among its training samples; the initial weights have seen "
            f"them, so validation figures will flatter the model. Keep the checkpoint's data, seed (or "
            f"train.split_seed) and validation_split, or validate on data the first run never trained on")


def _raw_rows(raw: Dataset, chosen, validation: bool = False):
    """The rows of a data source as it was read (``chosen`` of x, or x_val), one bytes value each,
    for comparison; None when the rows are not plain numbers."""
    x = raw.x_val if validation else raw.x
    if x is None or not isinstance(x, np.ndarray):
        return None
    if chosen is not None:
        x = x[chosen]
    flat = np.ascontiguousarray(np.asarray(x, dtype=np.float64).reshape(len(x), -1))
    return flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel()


def _offer_best_weights(run_dir: Path, train_controls: list) -> None:
    """Early stopping's best weights are not in last.npz; best.npz holds them when it recorded
    the same epoch (the usual case: early stopping watches ``train.monitor``)."""
    stoppers = [c for c in train_controls if isinstance(c, controls.EarlyStopping) and c.restore_best_weights]
    path = run_dir / "checkpoints" / "best.npz"
    if not stoppers or not path.is_file():
        return
    try:
        best = checkpoint.read(path)
    except CheckpointError:  # an unreadable best.npz must not stop the resume; its best is then lost
        return
    epoch = (best.meta.get("best") or {}).get("epoch")
    for c in stoppers:
        c.offer_best_weights(epoch, best.model)


def resume_config(run_dir: str | Path, overrides=(), device: str | None = None,
                  warnings: list | None = None) -> tuple[Config, checkpoint.Checkpoint]:
    """The config recorded in ``RUN_DIR/checkpoints/last.npz`` (with ``--set`` overrides) and the
    checkpoint; what the caller should warn of (a moved or changed plugin) is added to ``warnings``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"--resume: {run_dir} is not a run directory")
    path = run_dir / "checkpoints" / "last.npz"
    if not path.is_file():
        raise CheckpointError(f"--resume: {path} not found; nothing to resume from (was the run started by dlrun train?)")
    ckpt = checkpoint.read(path)
    if "config" not in ckpt.meta:
        raise CheckpointError(f"{path}: the checkpoint records no config; it cannot be resumed")
    recorded, found = named_for(ckpt.meta["config"], ckpt.meta.get("plugins"), path)  # (files given with --plugin)
    if warnings is not None:
        warnings.extend(found)
    # a config without name: is named as its run directory (for config.resolved.yaml), when that is a plain name
    name = rundir.run_name(run_dir)[0]
    return config_from_dict(recorded, name=name if re.fullmatch(r"[\w.+-]{1,200}", name) else "run",
                            overrides=list(overrides), device=device, origin=str(path), run_plugins=False,
                            from_checkpoint=True), ckpt


def config_edited(run_dir: str | Path, ckpt: checkpoint.Checkpoint) -> bool:
    """Whether RUN_DIR/config.yaml no longer says what the checkpoint records (edited by hand):
    --resume follows the checkpoint and rewrites the file, so the edit would be lost silently."""
    try:
        recorded_file, _ = parse_yaml((Path(run_dir) / "config.yaml").read_text(), str(run_dir))
    except (OSError, UnicodeDecodeError, DlrunError):
        return True
    return recorded_file != ckpt.meta.get("config")


def resume(run_dir: str | Path, config: Config, ckpt: checkpoint.Checkpoint, callbacks=(), warn=None) -> RunResult:
    """Continue a run in its own directory from ``last.npz`` up to ``config.train.epochs``; a run
    that trained all its epochs but whose ending was lost (no summary.json) is finished: its
    summary.json and a best.npz that was not written are written, and nothing is trained.
    ``warn(text)`` is called before training when the run cannot continue exactly as it would
    have (layers that draw random numbers, resumed on another number of ranks)."""
    run_dir = Path(run_dir)
    world = parallel.current()
    if not world.writes:  # another rank of several: rank 0 locks and writes the run directory
        return _resume(run_dir, config, ckpt, callbacks, world, warn)
    with world.preparing(), rundir.RunLock(run_dir):  # one process trains in a run directory at a time
        rundir.remove_temporary_files(run_dir)  # (left by a write that was killed; none is live now)
        return _resume(run_dir, config, ckpt, callbacks, world, warn)


def _resume(run_dir: Path, config: Config, ckpt: checkpoint.Checkpoint, callbacks, world, warn=None) -> RunResult:
    with world.preparing():
        position.check_split(ckpt.meta.get("config"), config)
        config.split_shares = ckpt.meta.get("split_shares", "per_class")  # the run's own split (data.split)
        fitted = snapshot.recorded_preprocessing(ckpt)
        if fitted is not None and (config.preprocess or Settings()) != fitted.settings:
            raise ConfigError(f"the run preprocessed its data with {_settings(fitted.settings)}, this resume asks for "
                              f"{_settings(config.preprocess or Settings())}: the model was trained on the first. A "
                              f"resumed run keeps its preprocessing; to change it, start a new run",
                              config.locate("data.preprocess"))
        run = assemble(config, fitted)
        logs = loggers(config) if world.writes else []
        ds, trainer = run.data, run.trainer
        note = snapshot.restore(trainer, ckpt, config.seed, config.frozen)
        if note and warn is not None and world.writes:
            warn(note)
        if trainer.epoch >= config.train.epochs and (trainer.position is not None or _finished(run_dir, trainer.epoch)):
            raise UsageError(f"{run_dir} has already trained {trainer.epoch} of {config.train.epochs} epochs; "
                             f"raise the total to continue, e.g. --set train.epochs={trainer.epoch + 10}")
        # stopped inside an epoch: it continues only as it started
        position.check_resume(trainer, ds.x, ds.y, ckpt.meta.get("data_digest"), str(ckpt.path))
        kept = None
        if world.writes:
            rundir.truncate_metrics(run_dir / "metrics.csv", trainer.epoch, trainer.tracker.names)
            kept = rundir.write_config(run_dir, config)
        before = rundir.previous_seconds(run_dir, trainer.epoch, trainer.position.seconds if trainer.position else 0.0)
        extra = {k: ckpt.meta[k] for k in ("init_from",) if k in ckpt.meta}
        extra["threads"] = threads.current()  # this process's (summary.json)
        extra["resumed_from_epoch"] = trainer.epoch
        if trainer.position is not None:
            extra["resumed_from_batch"] = trainer.position.batches_done  # of epoch resumed_from_epoch + 1
        _offer_best_weights(run_dir, run.controls)
    try:
        return _fit(run, run_dir, callbacks, extra, ckpt.meta.get("best"), before, logs)
    except DlrunError as e:  # failed before a good step (an interrupt saves its state and config): last.npz
        if not isinstance(e, Interrupted) and trainer.step == ckpt.meta.get("step") and kept is not None:
            rundir.put_back(kept)  # is kept, so are the config files
        raise


def _settings(s: Settings) -> str:
    return "{" + ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in vars(s).items()) + "}"


def _finished(run_dir: Path, epochs: int) -> bool:
    """Whether the run's summary.json records its ending after ``epochs`` epochs."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("epochs") == epochs
    except (OSError, ValueError, AttributeError):
        return False
